"""The wire protocol between the Slurm hooks, the CLI and the daemon (see docs/protocol.md)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

VERSION = 1

HOOK_OPS = frozenset(
    {
        "setup",
        "data_in",
        "test_data_in",
        "real_size",
        "pre_run",
        "post_run",
        "data_out",
        "test_data_out",
        "teardown",
        "get_status",
    }
)
USER_OPS = frozenset({"status", "jobs", "pools", "ping", "copy", "cancel", "drain"})
MAX_USER_REQUEST = 64 << 10  # bytes of a user-socket request line, or of an API credential line

# Network API (docs/protocol.md "Network API"): one line per connection each way. The client
# sends a munge credential (ASCII) and a newline; the credential's payload is API_PAYLOAD and
# then the same JSON request a user-socket client sends. The reply is the user socket's.
API_PAYLOAD = b"bbstage-api/1 "

OK, BUSY, ERROR = "ok", "busy", "error"
AGAIN = "again"  # not now: ask again (a draining daemon; bbstage/daemon/drain.py)


class ProtocolError(ValueError):
    """A request that does not follow docs/protocol.md."""


@dataclass(frozen=True)
class Request:
    """One decoded request."""

    op: str
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def job_id(self) -> str:
        job_id = str(self.fields.get("job_id", ""))
        if not job_id.isdigit():
            raise ProtocolError(f"{self.op}: job_id must be a number, got {job_id!r}")
        return job_id

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


@dataclass(frozen=True)
class Reply:
    """The daemon's verdict: status is ok, busy or error."""

    status: str
    message: str = ""

    @classmethod
    def ok(cls, message: str = "") -> Reply:
        return cls(OK, message)

    @classmethod
    def busy(cls, message: str = "") -> Reply:
        return cls(BUSY, message)

    @classmethod
    def again(cls, message: str) -> Reply:
        return cls(AGAIN, message)

    @classmethod
    def error(cls, message: str) -> Reply:
        """An error for Slurm: it becomes the job's reason and a slurmctld log line, so it
        is escaped and bounded (``bounded``)."""
        return cls(ERROR, bounded(message, as_bytes=True))


def from_bytes(data: bytes) -> str:
    """Bytes as text the bbstage way (docs/protocol.md "Bytes"): UTF-8, and every byte that is
    not part of a valid UTF-8 sequence as the lone surrogate U+DC80+byte (surrogateescape)."""
    return data.decode("utf-8", "surrogateescape")


def to_bytes(text: str) -> bytes:
    """The bytes that ``text`` stands for: the inverse of ``from_bytes``. A lone surrogate
    outside U+DC80..U+DCFF stands for no byte (only a JSON escape can make one): U+FFFD."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return "".join(
            c if not 0xD800 <= ord(c) <= 0xDFFF or 0xDC80 <= ord(c) <= 0xDCFF else "\ufffd"
            for c in text
        ).encode("utf-8", "surrogateescape")


# Characters that must never reach a terminal, a log line or a Slurm job reason raw: C0
# controls (newline and ESC included), DEL, C1 controls (also as the raw bytes 0x80-0x9f,
# U+DC80-U+DC9F: "Bytes"), and the invisible ones that reorder or split what is shown
# (bidirectional overrides and isolates, line and paragraph separators).
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff\udc80-\udc9f]"
)
ERROR_MAX = 1024  # characters of an error message shown to Slurm, stored or printed


def printable(text: str) -> str:
    """``text`` for a terminal, a log or a UTF-8 file, on one line: a byte that is not UTF-8
    is shown as \\xNN, and so is every control or invisible formatting character
    (``_UNSAFE``: \\x0a, \\x1b, \\u202e...). Text that a user controls (file names, an S3
    server's error messages) can then neither forge lines nor send escape sequences."""
    if not text.isascii():
        text = to_bytes(_controls(text)).decode("utf-8", "backslashreplace")
    return _controls(text)


def _controls(text: str) -> str:
    """``text`` with every ``_UNSAFE`` character as \\xNN or \\uNNNN."""
    return text if text.isprintable() else _UNSAFE.sub(_escape, text)


def _escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8 ("Bytes")
        code -= 0xDC00
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def bounded(text: str, limit: int = ERROR_MAX, *, as_bytes: bool = False) -> str:
    """An error message for Slurm (the job's reason, slurmctld's log), the state and
    ``bbstage status``: ``printable`` (``as_bytes``: only its control characters escaped,
    bytes that are not UTF-8 left as they are for the wire, "Bytes"), at most ``limit``
    characters and a note of how many were left out. The one choke point every error text
    passes (``Reply.error``, the engine's records)."""
    text = _controls(text) if as_bytes else printable(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def decode_request(data: bytes, allowed: frozenset[str]) -> Request:
    """Parse one request frame (or line) and check its op against ``allowed``.

    The hooks send valid UTF-8 (bytes that are not UTF-8 escaped as \\udcXX); raw bytes
    that are not UTF-8 mean the same (hooks of an older install), never a "bad request".
    """
    try:
        obj = json.loads(from_bytes(data))
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"request is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("request must be a JSON object")
    if obj.get("v") != VERSION:
        raise ProtocolError(f"unsupported protocol version {obj.get('v')!r}, expected {VERSION}")
    op = obj.pop("op", None)
    if op not in allowed:
        raise ProtocolError(f"unknown op {op!r}")
    obj.pop("v")
    return Request(op, obj)


def encode_request(op: str, **fields: Any) -> bytes:
    return json.dumps({"v": VERSION, "op": op, **fields}).encode()


def api_payload(op: str, **fields: Any) -> bytes:
    """What a network API client puts into its munge credential."""
    return API_PAYLOAD + encode_request(op, **fields)


def api_request(payload: bytes) -> bytes:
    """The request line inside a decoded credential's payload; ProtocolError unless it is
    one made for this API (a credential minted for another service does not parse)."""
    if not payload.startswith(API_PAYLOAD):
        raise ProtocolError("the credential's payload is not a bbstage API request")
    return payload[len(API_PAYLOAD) :]


def reply_frames(reply: Reply) -> list[bytes]:
    """Control-socket reply frames (after the envelope)."""
    return [reply.status.encode(), to_bytes(reply.message)]


def encode_user_reply(status: str, *, result: Any = None, message: str = "") -> bytes:
    body: dict[str, Any] = {"status": status}
    if status in (ERROR, AGAIN):
        body["message"] = message
    else:
        body["result"] = result
    return json.dumps(body).encode() + b"\n"
