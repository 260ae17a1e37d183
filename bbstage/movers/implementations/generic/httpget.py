"""Plain HTTP GETs of the generic stores: the rules every reply is judged by (``judge``),
the TLS every ``https://`` connection is verified with (``tls_context``), and HTTPS byte
ranges read in the thread that asks for them (``RangeReader``).

Why a reader of its own: fsspec's event loop runs every connection in its one thread, so
one thread decrypts the TLS of every range of a big file. ``RangeReader`` reads each range
over a blocking socket (``http.client``) in the thread of the mover's range pool that
asked for it: several ranges are decrypted at once, each written from one buffer, reused,
with no copy between. 1 GiB from the test server, 32 MiB x 4, 6 runs each beside
rclone's: 1.03x rclone, where the event loop's client reached 0.83-0.86x
(docs/performance.md).

The rules of the event loop's client hold here too: the host is checked against
``allowed_hosts`` before each connection is opened; TLS is verified by the same context
(the system's CAs and the site's ``ca_bundle``); a redirect is not followed here but handed
back, for that client to follow (it checks every host it connects to); errors name the
path, never more of the URL; nothing is read through a proxy (neither client reads the
environment's).
"""

from __future__ import annotations

import http.client
import ssl
import threading
from collections.abc import Callable
from typing import Any

from bbstage.movers.backends import Into
from bbstage.movers.base import TransferError

PIECE = 1 << 20  # a range's bytes are handed on in pieces of up to this
# seconds a connection, a send or a read of a range may take: aiohttp's limit on a whole
# request (fsspec's client), here on each step; the daemon stops a stalled transfer sooner
TIMEOUT = 300.0


def tls_context(bundle: str | None) -> ssl.SSLContext:
    """Verification against the system's CAs and, if given, the site's ``ca_bundle`` too:
    it is never turned off."""
    context = ssl.create_default_context()
    if bundle:
        context.load_verify_locations(cafile=bundle)
    return context


def judge(status: int, reason: str, name: str, ranged: bool) -> None:
    """Refuse a reply by its status: 404 as a missing file, 401 and 403 as permission
    denied, any other error as transient (retried); and a byte range answered with anything
    but 206 (a server that ignores ``Range`` sends the whole file), transient too: a
    mirror behind it may answer the next try. Errors name ``name``, never the URL (Azure's
    carries a signature)."""
    if status == 404:
        raise FileNotFoundError(name)
    if status in (401, 403):
        raise PermissionError(f"{name} (HTTP {status} {reason})")
    if status >= 400:
        raise TransferError(f"{name}: HTTP {status} {reason}", permanent=False)
    if ranged and status != 206:
        raise TransferError(
            f"{name}: the server answered a byte range with the whole file (HTTP {status})",
            permanent=False,
        )


class RangeReader:
    """Byte ranges of ``https://`` URLs, each read in the calling thread over a connection
    kept for the next (one per thread at a time, any number idle). ``check(url)`` refuses
    a host the site has not allowed, before any connection to it."""

    def __init__(self, context: ssl.SSLContext, check: Callable[[str], None]) -> None:
        self._context = context
        self._check = check
        self._idle: dict[tuple[str, int], list[http.client.HTTPSConnection]] = {}
        self._lock = threading.Lock()

    def read(self, url: Any, name: str, start: int, end: int, into: Into) -> int | None:
        """Read bytes ``start`` to ``end`` of ``url`` (a ``yarl.URL``, encoded as fsspec
        encodes it) into ``into``, in pieces (each valid during its call alone: the buffer
        is reused); the number of bytes read. None: the server redirected, and nothing was
        read."""
        self._check(str(url))
        key = (url.raw_host, url.port or 443)
        conn = self._take(key)
        kept = False
        try:
            conn.request("GET", url.raw_path_qs, headers={"Range": f"bytes={start}-{end - 1}"})
            reply = conn.getresponse()
            if 300 <= reply.status < 400:
                return None
            judge(reply.status, reply.reason, name, ranged=True)
            buffer = memoryview(bytearray(PIECE))
            at = start
            while n := reply.readinto(buffer):
                into(at, buffer[:n])
                at += n
            kept = not reply.will_close
            return at - start
        finally:
            if kept:
                with self._lock:
                    self._idle.setdefault(key, []).append(conn)
            else:
                conn.close()

    def _take(self, key: tuple[str, int]) -> http.client.HTTPSConnection:
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                return idle.pop()
        host, port = key
        return http.client.HTTPSConnection(host, port, timeout=TIMEOUT, context=self._context)
