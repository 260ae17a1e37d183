"""Talk to the daemon: its user socket where there is one (one request per connection, one
JSON line each way), else its network API (the same request inside a munge credential)."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bbstage import munge
from bbstage.protocol import AGAIN, api_payload, encode_request

API_ENV = "BBSTAGE_API"  # host:port of the daemon's network API; overrides the local socket


class DaemonError(RuntimeError):
    """The daemon answered with an error, or could not be reached."""


class Again(DaemonError):
    """The daemon said "not now, ask again" (it drains for an upgrade)."""


class Unreachable(DaemonError):
    """The daemon could not be reached (no socket, no API, nothing listening), or went away
    before it answered: what the request did is unknown, a restarted daemon can say."""


@dataclass(frozen=True)
class Target:
    """Where to ask: a Unix socket path, or an API ``host:port`` (with the local munged)."""

    socket: Path | None = None
    api: str | None = None
    munge_socket: Path | None = None

    def __str__(self) -> str:
        return str(self.socket) if self.socket else f"{self.api} (network API)"


def target(user_socket: Path, api_address: str, munge_socket: Path | None) -> Target:
    """``$BBSTAGE_API`` if set; the user socket if this host has it; else the config's
    ``api_address``; else the user socket (to say it is not there)."""
    env = os.environ.get(API_ENV)
    if env:
        return Target(api=env, munge_socket=munge_socket)
    try:
        if stat.S_ISSOCK(user_socket.stat().st_mode):
            return Target(socket=user_socket)
    except OSError:
        pass
    if api_address:
        return Target(api=api_address, munge_socket=munge_socket)
    return Target(socket=user_socket)


AGAIN_FOR = 300.0  # seconds a request answered "ask again" is asked again (an upgrade's drain)


def call(where: Path | Target, op: str, timeout: float = 10.0, **fields: Any) -> Any:
    """Send one request; the reply's result, or DaemonError with the daemon's message. A
    request answered "ask again" (a daemon draining for an upgrade) is sent again, its
    first answer said on stderr, for up to ``AGAIN_FOR`` seconds (the next daemon's)."""
    deadline, pause, asked = time.monotonic() + AGAIN_FOR, 0.5, False
    while True:
        try:
            return _call(where, op, timeout, **fields)
        except (Again, Unreachable) as exc:
            if isinstance(exc, Unreachable) and not asked:  # not running: no one to ask
                raise
            if time.monotonic() + pause > deadline:
                raise Unreachable(f"{exc} (asked again for {AGAIN_FOR:g} s)") from None
            if not asked:
                print(f"bbstage: {exc}; asking again", file=sys.stderr)
                asked = True
        time.sleep(pause)  # after an "again": the drain, then the gap before the next daemon
        pause = min(pause * 2, 5.0)


def _call(where: Path | Target, op: str, timeout: float, **fields: Any) -> Any:
    where = where if isinstance(where, Target) else Target(socket=where)
    if where.api:
        host, _, port = where.api.rpartition(":")
        family, address = socket.AF_INET, (host.strip("[]"), int(port))
        if ":" in host:
            family = socket.AF_INET6
        try:
            line = munge.encode(api_payload(op, **fields), where.munge_socket)
        except munge.MungeError as exc:
            raise Unreachable(f"cannot make a munge credential: {exc}") from None
    else:
        family, address = socket.AF_UNIX, str(where.socket)
        line = encode_request(op, **fields)
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(address)
            data = exchange(sock, line)
    except OSError as exc:
        reason = exc.strerror or exc
        raise Unreachable(f"staging daemon not reachable at {where}: {reason}") from None
    if not data:  # read the request and went away (killed, or stopping): ask again later
        raise Unreachable(f"staging daemon at {where} closed the connection without answering")
    try:
        reply = json.loads(data)
    except json.JSONDecodeError:
        raise DaemonError("the staging daemon sent an unreadable reply") from None
    if reply.get("status") == AGAIN:
        raise Again(reply.get("message", "not now"))
    if reply.get("status") != "ok":
        raise DaemonError(reply.get("message", "unknown error"))
    return reply["result"]


def exchange(sock: socket.socket, line: bytes) -> bytes:
    """Send one request line on a connected socket; the reply line (what came before EOF)."""
    sock.sendall(line + b"\n")
    return read_reply(sock)


def read_reply(sock: socket.socket) -> bytes:
    """The reply line on a connected socket (what came before EOF: b"" if none)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data
