"""Plain HTTP GETs of the generic stores: the rules every reply is judged by (``judge``),
the TLS every ``https://`` connection is verified with (``tls_context``), and HTTPS GETs and
HEADs in the thread that asks for them (``BlockingClient``).

Why a client of its own: fsspec's event loop runs every connection in its one thread, so
one thread decrypts the TLS of every range of a big file, and every small file is two hops
between threads. ``BlockingClient`` reads over blocking sockets (``http.client``) in the
thread of the mover that asks: several ranges or files are decrypted at once, a range
written from one buffer, reused, with no copy between. Against rclone, run by run (the
median of each run's ratio, docs/performance.md): 1 GiB over HTTPS 0.96-0.97x with the
same ranges, where the event loop's client reached 0.83-0.86x (1.04-1.05x with the ranges
kept since); 1,000 x 64 KiB 1.13-1.14x, against 0.91-1.06x.

The rules of the event loop's client hold here too: the host is checked against
``allowed_hosts`` before each connection is opened; TLS is verified by the same context
(the system's CAs and the site's ``ca_bundle``); a redirect is not followed here but handed
back, for that client to follow (it checks every host it connects to); errors name the
path, never more of the URL. No proxy is used: HTTPS's event-loop client reads none from
the environment either, and Azure reads through its event loop when the worker's
environment names one.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from bbstage.movers.backends import Into
from bbstage.movers.base import TransferError

PIECE = 1 << 20  # a range's bytes are handed on in pieces of up to this
# seconds a connection, a send or a read of a range may take: aiohttp's limit on a whole
# request (fsspec's client), here on each step; the daemon stops a stalled transfer sooner
TIMEOUT = 300.0

T = TypeVar("T")


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


def too_much(name: str, most: int) -> TransferError:
    """A server sent more than the ``most`` bytes asked for (a range) or planned (a whole
    file, by its listing): transient, as ``judge``'s refusals (a mirror behind it may answer
    the next try); what came is not kept."""
    return TransferError(
        f"{name}: the server sent more than the {most} bytes asked for", permanent=False
    )


class BlockingClient:
    """GETs of ``https://`` URLs (``http://`` too: a local emulator), each in the calling
    thread over a connection kept for the next (one per thread at a time, any number idle):
    byte ranges (``read_range``), small files whole (``read``) and sizes (``size``, a
    HEAD). ``check(url)`` refuses a host the site has not allowed (https:
    ``allowed_hosts``), before any connection to it. URLs are ``yarl.URL``s, encoded as
    fsspec encodes them. A redirect (and a HEAD refused) is answered None, nothing read."""

    def __init__(
        self, context: ssl.SSLContext, check: Callable[[str], None] = lambda url: None
    ) -> None:
        self._context = context
        self._check = check
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def read_range(self, url: Any, name: str, start: int, end: int, into: Into) -> int | None:
        """Bytes ``start`` to ``end`` into ``into``, in pieces (each valid during its call
        alone: the buffer is reused); the number of bytes read. A body longer than the
        range is refused (``too_much``), nothing past ``end`` handed on."""

        def pieces(reply: http.client.HTTPResponse) -> int:
            buffer = memoryview(bytearray(min(PIECE, end - start)))
            at = start
            while at < end and (n := reply.readinto(buffer[: end - at])):
                into(at, buffer[:n])
                at += n
            if at == end and reply.read(1):
                raise too_much(name, end - start)
            return at - start

        return self._get(url, name, {"Range": f"bytes={start}-{end - 1}"}, pieces)

    def read(self, url: Any, name: str, size: int) -> bytes | None:
        """The whole body, planned at ``size`` bytes: a longer one is refused after
        ``size`` + 1 bytes (``too_much``), never gathered whole."""

        def body(reply: http.client.HTTPResponse) -> bytes:
            data = reply.read(size + 1)
            if len(data) > size:
                raise too_much(name, size)
            return data

        return self._get(url, name, {}, body)

    def size(self, url: Any, name: str) -> int | None:
        """The size a HEAD answers (``Content-Length`` of a body sent as is); None for a
        redirect, a refusal or a reply that names none: the caller asks fsspec's client,
        which follows a redirect and tries a GET where a HEAD tells nothing."""

        def length(reply: http.client.HTTPResponse) -> int | None:
            reply.read()
            given = reply.getheader("Content-Length", "")  # two headers: "5, 6"
            coded = reply.getheader("Content-Encoding", "identity") not in ("identity", "")
            plain = given.isascii() and given.isdigit() and len(given) <= 18
            return int(given) if plain and not coded else None

        return self._get(url, name, {}, length, "HEAD")

    def _get(
        self,
        url: Any,
        name: str,
        headers: dict[str, str],
        body: Callable[[http.client.HTTPResponse], T | None],
        method: str = "GET",
    ) -> T | None:
        self._check(str(url))
        key = (url.scheme, url.raw_host, url.port)
        with self._lock:
            idle = self._idle.get(key)
            conn = idle.pop() if idle else None
        fresh = conn is None
        if conn is None:
            conn = self._connect(*key)
        kept = False
        try:
            try:
                conn.request(method, url.raw_path_qs, headers=headers)
                reply = conn.getresponse()
            except ConnectionError:
                if fresh:
                    raise
                conn.close()  # kept past the server's patience: it closed it
                conn = self._connect(*key)
                conn.request(method, url.raw_path_qs, headers=headers)
                reply = conn.getresponse()
            if 300 <= reply.status < 400 or (method == "HEAD" and reply.status != 200):
                return None  # a HEAD refused may be a GET allowed: the caller asks fsspec
            judge(reply.status, reply.reason, name, ranged="Range" in headers)
            got = body(reply)
            kept = reply.isclosed() and not reply.will_close  # read to its end, kept alive
            return got
        finally:
            if kept:
                with self._lock:
                    self._idle.setdefault(key, []).append(conn)
            else:
                conn.close()

    def _connect(self, scheme: str, host: str, port: int) -> http.client.HTTPConnection:
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=TIMEOUT, context=self._context)
        return http.client.HTTPConnection(host, port, timeout=TIMEOUT)  # a local emulator
