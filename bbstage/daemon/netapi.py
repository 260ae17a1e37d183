"""The network API (``[daemon] api_address``): users' requests over TCP, each authenticated
by munge (docs/protocol.md "Network API", docs/security.md "Network API").

A connection carries one line each way: a munge credential whose payload is the request
(``protocol.api_payload``), then the reply ``Server.respond`` gives on the Unix socket. The
uid comes from the credential, checked by the site's munged (``munge_socket``): another
key, an expired or a replayed credential is refused by munged, and a credential seen before
also by our own cache (``Replays``: munged forgets the ones it saw when it restarts).

Bounded like the user socket: the credential line within ``API_READ_TIMEOUT`` seconds and
``MAX_USER_REQUEST`` bytes, decoded by ``API_DECODERS`` threads of their own (never on the
hooks' event loop); at most ``API_CONNECTIONS`` requests served at once and
``API_CONNECTIONS_PER_HOST`` from one address (past either: "busy"), then the uid's share of
the user socket's allowance. A login node is one address for all its users, and anyone
can hold connections open without sending a credential: so the bounds count only
connections whose line has come in. Those still waiting for theirs are at most
``API_UNPROVEN``; past that, the oldest of the address holding the most of them is closed
for the newcomer. A client sends its credential as it connects, so one user's idle
connections cannot keep another's requests out (docs/security.md, "Network API").
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import structlog

from bbstage import munge, protocol
from bbstage.protocol import ERROR, MAX_USER_REQUEST, ProtocolError

log = structlog.get_logger("bbstage.daemon.netapi")

API_CONNECTIONS = 256
API_CONNECTIONS_PER_HOST = 32
API_READ_TIMEOUT = 2.0  # seconds for the credential line: the client sends it on connecting
API_WRITE_TIMEOUT = 5.0
API_DECODERS = 4  # threads that ask munged to check credentials
API_UNPROVEN = 256  # connections waiting for their line at once (the oldest gives way)
REPLAY_ENTRIES = 1 << 16  # credentials remembered at most (each until it expires)


class Server(Protocol):
    """What the API needs of ``bbstage.daemon.server.Server``: its users' allowance and handler."""

    def admit(self, uid: int) -> bool: ...
    def busy(self, uid: int) -> str: ...
    def release(self, uid: int) -> None: ...
    async def respond(self, line: bytes, uid: int, origin: str | None = None) -> bytes: ...


class Replays:
    """Credentials accepted before, each until its munge expiry (then munge refuses it
    anyway): a second use is refused even after munged has restarted and forgotten it."""

    def __init__(self, limit: int = REPLAY_ENTRIES) -> None:
        self._seen: dict[bytes, float] = {}  # digest → expiry, oldest first
        self._limit = limit

    def first_use(self, credential: bytes, expires: float) -> bool:
        """Record ``credential``; False if it was recorded before (a replay)."""
        key = hashlib.sha256(credential).digest()
        if key in self._seen:
            return False
        now = time.time()
        if len(self._seen) >= self._limit:
            self._seen = {k: t for k, t in self._seen.items() if t > now}
            while len(self._seen) >= self._limit:  # all still valid: forget the oldest
                del self._seen[next(iter(self._seen))]
        self._seen[key] = expires
        return True


class Api:
    def __init__(self, server: Server, address: str, munge_socket: Path) -> None:
        self.server = server
        self.host, _, port = address.rpartition(":")
        self.port = int(port)
        self.munge_socket = munge_socket
        self.replays = Replays()
        self._decoders = ThreadPoolExecutor(API_DECODERS, thread_name_prefix="munge")
        self._open: Counter[str] = Counter()  # requests being served, by peer address
        # Connections whose line has not come in, by address, each address's oldest first.
        self._unproven: dict[str, dict[asyncio.StreamWriter, None]] = {}
        self._listener: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._listener = await asyncio.start_server(
            self._serve, self.host.strip("[]"), self.port, limit=MAX_USER_REQUEST,
            reuse_address=True,
        )  # fmt: skip
        log.info("api listening", address=f"{self.host}:{self.port}", munge=str(self.munge_socket))

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self._decoders.shutdown(wait=False, cancel_futures=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str((writer.get_extra_info("peername") or ("?",))[0])
        uid = None
        counted = False
        try:
            self._wait_for_line(peer, writer)
            try:
                line = await asyncio.wait_for(reader.readline(), API_READ_TIMEOUT)
            except (ValueError, asyncio.LimitOverrunError, TimeoutError):
                line = None
            finally:
                self._proven(peer, writer)
            if line == b"":  # closed before a byte came (or put out for a newer one)
                return
            if line is None:
                body = _error(_BAD_LINE)
            elif (
                self._open.total() >= API_CONNECTIONS
                or self._open[peer] >= API_CONNECTIONS_PER_HOST
            ):
                body = _error(f"staging daemon busy: {self._open.total()} API requests are"
                              " being served; try again in a moment")  # fmt: skip
            else:
                self._open[peer] += 1
                counted = True
                uid, body = await self._answer(line.strip(), peer)
            writer.write(body)
            await asyncio.wait_for(writer.drain(), API_WRITE_TIMEOUT)
        except (ConnectionError, OSError, TimeoutError):
            pass
        finally:
            if counted:
                self._open[peer] -= 1
                if not self._open[peer]:
                    del self._open[peer]
            writer.close()

    def _wait_for_line(self, peer: str, writer: asyncio.StreamWriter) -> None:
        """Count ``writer`` as waiting for its line; past ``API_UNPROVEN`` such connections,
        close the oldest of the address that holds the most of them."""
        if sum(map(len, self._unproven.values())) >= API_UNPROVEN:
            most = max(self._unproven, key=lambda host: len(self._unproven[host]))
            oldest = next(iter(self._unproven[most]))
            self._proven(most, oldest)
            oldest.transport.abort()  # its readline ends: a dropped connection
        self._unproven.setdefault(peer, {})[writer] = None

    def _proven(self, peer: str, writer: asyncio.StreamWriter) -> None:
        """``writer`` waits for its line no more (it came, or the connection ended)."""
        waiting = self._unproven.get(peer, {})
        waiting.pop(writer, None)
        if not waiting:
            self._unproven.pop(peer, None)

    async def _answer(self, credential: bytes, peer: str) -> tuple[int | None, bytes]:
        """(the caller's uid if authenticated, the reply); ``peer``: the client's address."""
        if not credential:
            return None, _error("not authenticated: send a munge credential (see docs/protocol.md)")
        loop = asyncio.get_running_loop()
        try:
            cred = await loop.run_in_executor(
                self._decoders, munge.decode, credential, self.munge_socket
            )
        except munge.MungeError as exc:
            if exc.code == munge.EMUNGE_SOCKET:
                log.error("munged not reachable", socket=str(self.munge_socket), error=str(exc))
            return None, _error(f"not authenticated: {exc}")
        if not self.replays.first_use(credential, cred.encoded + cred.ttl):
            return None, _error("not authenticated: munge: Replayed credential")
        try:
            line = protocol.api_request(cred.payload)
        except ProtocolError as exc:
            return None, _error(f"bad request: {exc}")
        if not self.server.admit(cred.uid):
            return None, _error(self.server.busy(cred.uid))
        try:
            return cred.uid, await self.server.respond(line, cred.uid, origin=peer)
        finally:
            self.server.release(cred.uid)


_BAD_LINE = (
    f"bad request: one munge credential and a newline, within {MAX_USER_REQUEST} bytes"
    f" and {API_READ_TIMEOUT:g} s"
)


def _error(message: str) -> bytes:
    return protocol.encode_user_reply(ERROR, message=message)
