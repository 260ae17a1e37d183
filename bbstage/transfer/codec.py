"""The one codec for the events a worker sends back to root (``bbstage.transfer``).

A worker runs as the job's user, who may ptrace it (or exploit a bug in what it parses: S3
responses, file names) and then write anything to its pipe. So root never unpickles what a
worker sends: each event is one JSON object of the known types with exactly their fields,
typed (``int`` within ``0 .. 2**63-1``, ``bool``, ``str``, ``tuple[str, ...]``), at most
``MAX_FRAME`` bytes; paths hold no NUL. Anything else is a ``CodecError`` and the transfer
fails. Used by the local executor (length-prefixed frames of a ``multiprocessing`` pipe:
``send``/``receive``), by the Dask child (one JSON line per event: ``frames``/``decode``) and
for the Dask topic (``to_dict``/``from_dict``).

Root's side of the other direction (the ``TransferSpec`` root sends to the worker) stays a
pickle: root writes it, the user's process reads it, and a pickle from root is no risk to
root. The other boundaries between processes, and what crosses them:

* a Dask task (root on its node) to the daemon: its events through this codec on the
  attempt's topic; its result (the outcome this codec decoded from the child) through
  ``distributed``, root to root over mutual TLS;
* the walk process to its worker (``bbstage.transfer.walkproc``): ``marshal`` frames, the user to
  the same user's process, never to root;
* ``bbstage bench --as-user``'s child (the user) to root: JSON arrays, checked
  (``bbstage.bench.run``); root to the user's unlinker: NUL-separated paths
  (``identity.unlink_as``).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Iterator
from typing import Any, Protocol

from bbstage.transfer import Event, Failed, TempFile, TempsSettled

MAX_FRAME = 1 << 20  # bytes of one encoded event; a longer one is refused unread
MAX_INT = (1 << 63) - 1  # what SQLite stores (sizes and counts beyond are refused)
_PATHS = {(TempFile, "path"), (TempsSettled, "paths")}  # str fields that name files


class CodecError(ValueError):
    """What a worker sent is not exactly one known, typed event."""


def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


# Every event type of bbstage.transfer, with its fields' types (follows that module).
_TYPES: dict[str, tuple[type, dict[str, Any]]] = {
    t.__name__: (t, _fields(t)) for t in typing.get_args(Event)
}


def _value(value: Any, hint: Any, path: bool) -> Any:
    """``value`` as a ``hint`` (int, bool, str or tuple[str, ...]), or CodecError."""
    if hint is int and type(value) is int:
        if not 0 <= value <= MAX_INT:
            raise CodecError(f"{value} is out of range")
        return value
    if hint in (bool, str) and type(value) is hint:
        if path and "\0" in value:
            raise CodecError("a path with a NUL character")
        return value
    if typing.get_origin(hint) is tuple and type(value) in (list, tuple):
        item = typing.get_args(hint)[0]
        return tuple(_value(v, item, path) for v in value)
    raise CodecError(f"{type(value).__name__} where {hint} belongs")


def to_dict(event: Event) -> dict[str, Any]:
    """An event as a JSON- and msgpack-able dict."""
    return {"type": type(event).__name__, **vars(event)}


def from_dict(data: Any) -> Event:
    """The event a dict describes: exactly the fields of a known type, typed."""
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise CodecError("not an object with a type")
    cls, fields = _TYPES.get(data["type"], (None, {}))
    if cls is None:
        raise CodecError(f"unknown event type {data['type'][:40]!r}")
    if set(data) != {"type", *fields}:
        raise CodecError(f"the fields of {data['type']} are not {sorted(fields)}")
    return cls(**{k: _value(data[k], t, (cls, k) in _PATHS) for k, t in fields.items()})  # type: ignore[no-any-return]


def encode(event: Event) -> bytes:
    """One event as one line of JSON (no newline in it), or CodecError if over MAX_FRAME."""
    frame = json.dumps(to_dict(event), separators=(",", ":")).encode()
    if len(frame) > MAX_FRAME:
        raise CodecError(f"a {type(event).__name__} event of {len(frame)} bytes")
    return frame


def frames(event: Event) -> Iterator[bytes]:
    """The event's frames, each within MAX_FRAME: a long ``TempsSettled`` is split, a long
    ``Failed`` message cut (the sender's side: whatever it is given fits)."""
    try:
        yield encode(event)
        return
    except CodecError:
        if isinstance(event, TempsSettled) and len(event.paths) > 1:
            half = len(event.paths) // 2
            yield from frames(TempsSettled(event.paths[:half]))
            yield from frames(TempsSettled(event.paths[half:]))
        elif isinstance(event, Failed):
            cut = event.message[: MAX_FRAME // 8] + " [cut]"  # \uXXXX escapes: 6 bytes each
            yield encode(Failed(cut, event.permanent))
        else:
            raise


def decode(frame: bytes) -> Event:
    """The event one frame holds, or CodecError (its length is bounded where it is read:
    ``receive``, and the Dask child's lines in ``bbstage.transfer.dask_task``)."""
    try:
        data = json.loads(frame)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CodecError(f"not JSON: {str(exc)[:80]}") from None
    return from_dict(data)


class Connection(Protocol):
    """The part of ``multiprocessing.connection.Connection`` the pipe uses."""

    def send_bytes(self, buf: bytes) -> None: ...

    def recv_bytes(self, maxlength: int | None = None) -> bytes: ...


class Pipe:
    """A worker's ``Sink``: its events as frames on its ``multiprocessing`` pipe."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def send(self, event: Event) -> None:
        for frame in frames(event):
            self._conn.send_bytes(frame)


def receive(conn: Connection) -> Event:
    """The next event from a worker's pipe: CodecError if it is not one, or longer than
    MAX_FRAME (not read: the pipe is unusable then); EOFError/OSError if the pipe broke."""
    try:
        frame = conn.recv_bytes(MAX_FRAME)
    except OSError as exc:
        if exc.errno is None:  # "bad message length": over maxlength (or a garbled header)
            raise CodecError(f"a message over {MAX_FRAME} bytes") from None
        raise
    return decode(frame)
