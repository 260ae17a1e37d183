"""The network API (``[daemon] api_address``): users' requests over TCP, each authenticated
by munge (docs/protocol.md "Network API", docs/security.md "Network API").

A connection carries one line each way: a munge credential whose payload is the request
(``protocol.api_payload``), then the reply ``Server.respond`` gives on the Unix socket. The
uid comes from the credential, checked by the site's munged (``munge_socket``): another
key, an expired or a replayed credential is refused by munged, and a credential seen before
also by our own cache (``Replays``: munged forgets the ones it saw when it restarts).

Bounded like the user socket: at most ``API_CONNECTIONS`` connections at once and
``API_CONNECTIONS_PER_HOST`` from one address (past either: "busy" at once), the credential
line within ``API_READ_TIMEOUT`` seconds and ``MAX_USER_REQUEST`` bytes, decoded by
``API_DECODERS`` threads of their own (never on the hooks' event loop), then the uid's share
of the user socket's allowance.
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

log = structlog.get_logger("bbstage.netapi")

API_CONNECTIONS = 256
API_CONNECTIONS_PER_HOST = 32
API_READ_TIMEOUT = 2.0  # seconds for the credential line: the client sends it on connecting
API_WRITE_TIMEOUT = 5.0
API_DECODERS = 4  # threads that ask munged to check credentials
REPLAY_ENTRIES = 1 << 16  # credentials remembered at most (each until it expires)


class Server(Protocol):
    """What the API needs of ``bbstage.server.Server``: its users' allowance and handler."""

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
        self._open: Counter[str] = Counter()  # connections by peer address
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
            if (
                self._open.total() >= API_CONNECTIONS
                or self._open[peer] >= API_CONNECTIONS_PER_HOST
            ):
                body = _error(f"staging daemon busy: {self._open.total()} API connections are"
                              " open; try again in a moment")  # fmt: skip
            else:
                self._open[peer] += 1
                counted = True
                try:
                    line = await asyncio.wait_for(reader.readline(), API_READ_TIMEOUT)
                    uid, body = await self._answer(line.strip(), peer)
                except (ValueError, asyncio.LimitOverrunError, TimeoutError):
                    body = _error(_BAD_LINE)
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
