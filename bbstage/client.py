"""Talk to the daemon's user socket (one request per connection, one JSON line each way)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from bbstage.protocol import encode_request


class DaemonError(RuntimeError):
    """The daemon answered with an error, or could not be reached."""


def call(path: Path, op: str, timeout: float = 10.0, **fields: Any) -> Any:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(encode_request(op, **fields) + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        reason = exc.strerror or exc
        raise DaemonError(f"staging daemon not reachable at {path}: {reason}") from None
    try:
        reply = json.loads(data)
    except json.JSONDecodeError:
        raise DaemonError("the staging daemon sent an unreadable reply") from None
    if reply.get("status") != "ok":
        raise DaemonError(reply.get("message", "unknown error"))
    return reply["result"]
