"""MUNGE credentials through libmunge (Debian ``libmunge2``) by ctypes: no process per call.

``encode`` asks the local munged for a credential that carries a payload and the caller's
uid and gid; ``decode`` asks munged (which holds the site's key) to check one and gives
back the payload and the uid and gid of the process that made it. munged itself refuses a
credential made with another key, one past its time to live (EMUNGE_CRED_EXPIRED) and one
it has decoded before (EMUNGE_CRED_REPLAYED): any status but success is a ``MungeError``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SOCKET = Path("/run/munge/munge.socket.2")  # munge's own default

# munge.h (0.5.x): enum munge_opt and enum munge_err.
_OPT_TTL, _OPT_ENCODE_TIME, _OPT_SOCKET = 4, 6, 8
EMUNGE_SUCCESS, EMUNGE_SOCKET = 0, 6
EMUNGE_CRED_EXPIRED, EMUNGE_CRED_REWOUND, EMUNGE_CRED_REPLAYED = 15, 16, 17


class MungeError(RuntimeError):
    """munge refused or could not make or check a credential; ``code`` is munge's error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Decoded:
    payload: bytes
    uid: int
    gid: int
    encoded: int  # when munged made it (seconds since the epoch)
    ttl: int  # its time to live, seconds


_lib: ctypes.CDLL | None = None
_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]
_lock = threading.Lock()


def _munge() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is None:
            name = ctypes.util.find_library("munge") or "libmunge.so.2"
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                raise MungeError(
                    -1, "libmunge is not installed (Debian: apt install libmunge2)"
                ) from None
            lib.munge_ctx_create.restype = ctypes.c_void_p
            lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
            lib.munge_ctx_strerror.restype = ctypes.c_char_p
            lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
            lib.munge_strerror.restype = ctypes.c_char_p
            lib.munge_strerror.argtypes = [ctypes.c_int]
            lib.munge_encode.argtypes = [
                ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
            ]  # fmt: skip
            lib.munge_decode.argtypes = [
                ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint),
                ctypes.POINTER(ctypes.c_uint),
            ]  # fmt: skip
            _lib = lib
        return _lib


class _Context:
    """A munge context on ``socket`` (destroyed on exit)."""

    def __init__(self, lib: ctypes.CDLL, socket: Path | None, ttl: int | None = None) -> None:
        self.lib = lib
        self.ctx = lib.munge_ctx_create()
        if not self.ctx:
            raise MungeError(5, "munge: out of memory")
        if socket is not None:
            self._set(_OPT_SOCKET, ctypes.c_char_p(bytes(socket)))
        if ttl is not None:
            self._set(_OPT_TTL, ctypes.c_int(ttl))

    def _set(self, opt: int, value: ctypes.c_char_p | ctypes.c_int) -> None:
        code = self.lib.munge_ctx_set(ctypes.c_void_p(self.ctx), ctypes.c_int(opt), value)
        if code != EMUNGE_SUCCESS:
            raise self.error(code)

    def get_int(self, opt: int, kind: type[ctypes.c_int] | type[ctypes.c_long]) -> int:
        value = kind(0)
        self.lib.munge_ctx_get(ctypes.c_void_p(self.ctx), ctypes.c_int(opt), ctypes.byref(value))
        return int(value.value)

    def error(self, code: int) -> MungeError:
        text = self.lib.munge_ctx_strerror(self.ctx) or self.lib.munge_strerror(code) or b"?"
        return MungeError(code, f"munge: {text.decode(errors='replace')}")

    def __enter__(self) -> _Context:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.lib.munge_ctx_destroy(self.ctx)


def encode(payload: bytes, socket: Path | None = None, ttl: int | None = None) -> bytes:
    """A credential (ASCII, ``MUNGE:...:``) carrying ``payload`` and this process's uid and
    gid, from the munged on ``socket`` (munge's default when None); ``ttl`` in seconds
    (munged's default, 300 s, when None)."""
    lib = _munge()
    with _Context(lib, socket, ttl) as ctx:
        out = ctypes.c_void_p()
        code = lib.munge_encode(ctypes.byref(out), ctx.ctx, payload, len(payload))
        try:
            if code != EMUNGE_SUCCESS:
                raise ctx.error(code)
            return ctypes.string_at(out.value) if out.value else b""
        finally:
            if out.value:
                _libc.free(out)


def decode(credential: bytes, socket: Path | None = None) -> Decoded:
    """Check ``credential`` with the munged on ``socket``: its payload and the uid and gid of
    the process that made it. Any status but success (another key, expired, rewound,
    replayed, garbage) raises ``MungeError``."""
    lib = _munge()
    with _Context(lib, socket) as ctx:
        buf, length = ctypes.c_void_p(), ctypes.c_int(0)
        uid, gid = ctypes.c_uint(0), ctypes.c_uint(0)
        code = lib.munge_decode(
            credential, ctx.ctx, ctypes.byref(buf), ctypes.byref(length),
            ctypes.byref(uid), ctypes.byref(gid),
        )  # fmt: skip
        try:
            if code != EMUNGE_SUCCESS:
                raise ctx.error(code)
            payload = ctypes.string_at(buf.value, length.value) if buf.value else b""
        finally:
            if buf.value:
                _libc.free(buf)
        encoded = ctx.get_int(_OPT_ENCODE_TIME, ctypes.c_long)
        ttl = ctx.get_int(_OPT_TTL, ctypes.c_int)
    return Decoded(payload, int(uid.value), int(gid.value), encoded, ttl)
