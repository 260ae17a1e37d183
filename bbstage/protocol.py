"""The wire protocol between the Slurm hooks, the CLI and the daemon (see docs/protocol.md)."""

from __future__ import annotations

import json
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
USER_OPS = frozenset({"status", "jobs", "pools", "ping"})

OK, BUSY, ERROR = "ok", "busy", "error"


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
    def error(cls, message: str) -> Reply:
        return cls(ERROR, message)


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


def printable(text: str) -> str:
    """``text`` for a terminal or a UTF-8 file: a byte that is not UTF-8 is shown as \\xNN."""
    if text.isascii():
        return text
    return to_bytes(text).decode("utf-8", "backslashreplace")


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


def reply_frames(reply: Reply) -> list[bytes]:
    """Control-socket reply frames (after the envelope)."""
    return [reply.status.encode(), to_bytes(reply.message)]


def encode_user_reply(status: str, *, result: Any = None, message: str = "") -> bytes:
    body: dict[str, Any] = {"status": status}
    if status == ERROR:
        body["message"] = message
    else:
        body["result"] = result
    return json.dumps(body).encode() + b"\n"
