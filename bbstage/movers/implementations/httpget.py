"""Plain HTTP GETs of the stores ``https`` and ``azure``: the rules every reply is judged
by (``judge``), the TLS every ``https://`` connection is verified with (``tls_context``,
``system_cas``), and the client of HTTPS reads (``BlockingClient``), over libcurl (pycurl).

Why a client of its own: fsspec's event loop runs every connection in its one thread, so
one thread decrypts the TLS of every range of a big file, and every small file is two hops
between threads. ``BlockingClient`` reads a big file's ranges each in the mover's thread
that asks (several decrypted at once), and small files and sizes all on one thread of its
own through libcurl's multi interface, many at once, libcurl's C doing the reading and
parsing. Python's own clients cost more of the CPUs the server needs too: http.client
ranges 1.3-2.2x libcurl's CPU for 1 GiB, a thread per small file 3-4x for 1,000 x 64 KiB
(docs/performance.md).

The rules of the event loop's client hold here too: the host is checked against
``allowed_hosts`` before each request; TLS is verified against the same CAs (the system's
and the site's ``ca_bundle``); a redirect is not followed here but handed back, for that
client to follow (it checks every host it connects to); errors name the path, never more
of the URL. No proxy is used, whatever the environment says: HTTPS's event-loop client
reads none from it either, and Azure reads through its event loop when the worker's
environment names one.
"""

from __future__ import annotations

import collections
import functools
import http
import os
import re
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from itertools import islice
from typing import Any

import pycurl

from bbstage.movers.backends import Into
from bbstage.movers.base import TransferError

PIECE = 1 << 20  # a range's bytes are handed on in pieces of this (libcurl's buffer too)
# seconds a connection, a send or a read of a range may take: aiohttp's limit on a whole
# request (fsspec's client), here on each step; the daemon stops a stalled transfer sooner
TIMEOUT = 300.0


# a file read ahead: (planned size, its first bytes as they came, in pieces (joined by the
# reading thread, with the rest: not on the thread that walks the tree), their validator,
# the rest's GET or None)
_Ahead = tuple[int, list[bytes], bytes, "Future[tuple[int, list[bytes]]] | None"]


def tls_context(bundle: str | None) -> ssl.SSLContext:
    """Verification against the system's CAs (``system_cas``) and, if given, the site's
    ``ca_bundle`` too: it is never turned off."""
    cafile, capath = system_cas()
    context = ssl.create_default_context(cafile=cafile, capath=capath)
    if bundle:
        context.load_verify_locations(cafile=bundle)
    return context


@functools.cache
def system_cas() -> tuple[str | None, str | None]:
    """The system's CAs, where OpenSSL's default paths name them: (a file, a directory).
    The file is left out where a directory holds the same CAs under OpenSSL's hashed
    names, each read there when a chain needs it: OpenSSL's own (Debian's /etc/ssl/certs,
    SUSE's), else Red Hat's (``update-ca-trust`` writes its ``directory-hash`` beside the
    file it extracts, from the same anchors; OpenSSL's directory there has no hashed
    names). Elsewhere the file is read whole: Debian's (146 CAs) cost 40 ms of CPU for
    each TLS context in Python and 6-13 ms for each libcurl handle."""
    paths = ssl.get_default_verify_paths()
    for capath in (paths.capath, RED_HAT_HASHED):
        if capath and _hashed(capath):
            return None, capath
    return paths.cafile, paths.capath if paths.capath and os.path.isdir(paths.capath) else None


def _hashed(directory: str) -> bool:
    """Does ``directory`` hold CAs under OpenSSL's hashed names?"""
    try:
        return any(_HASHED.fullmatch(e) for e in os.listdir(directory))
    except OSError:
        return False


# update-ca-trust's hashed directory of the TLS anchors (Red Hat 9 and its rebuilds)
RED_HAT_HASHED = "/etc/pki/ca-trust/extracted/pem/directory-hash"
_HASHED = re.compile(r"[0-9a-f]{8}\.[0-9]+")  # OpenSSL's name of a CA in a CA directory


def judge(status: int, reason: str, name: str, ranged: bool) -> None:
    """Refuse a reply by its status: 404 as a missing file, 401 and 403 as permission
    denied, any other error as transient (retried); and a byte range answered with anything
    but 206 (a server that ignores ``Range`` sends the whole file), transient too: a
    mirror behind it may answer the next try. A redirect that reaches here was not to be
    followed (Azure's: its service sends none), permanently. Errors name ``name``, never the
    URL (Azure's carries a signature)."""
    if 300 <= status < 400:
        raise TransferError(f"{name}: the server redirected it (HTTP {status}), not followed")
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


class Changed(TransferError):
    """A file changed while it was read: a reply of another version than the one its size
    came with, or of a file of another size; transient (the next try reads the version it
    has then: the caller keeps that)."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name}: changed while it was read ({why})", permanent=False)


def of_size(ranges: list[bytes], name: str, planned: int) -> None:
    """Refuse a range (a 206) whose ``Content-Range`` (``ranges``: each one sent) is not one
    range of a file of ``planned`` bytes (``Changed``)."""
    said = _ANY_RANGE.fullmatch(ranges[0]) if len(ranges) == 1 else None
    if said is None or int(said[1]) != planned:
        now = said[1].decode() if said is not None else "an unknown number of"
        raise Changed(name, f"it has {now} bytes, planned {planned}")


def keep(kept: collections.OrderedDict[Any, Any], key: Any, value: Any, most: int) -> None:
    """Put ``key`` in ``kept`` as its newest, the oldest dropped past ``most``."""
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > most:
        kept.popitem(last=False)


def too_much(name: str, most: int) -> TransferError:
    """A server sent more than the ``most`` bytes asked for (a range) or planned (a whole
    file, by its listing): transient, as ``judge``'s refusals (a mirror behind it may answer
    the next try); what came is not kept."""
    return TransferError(
        f"{name}: the server sent more than the {most} bytes asked for", permanent=False
    )


class BlockingClient:
    """GETs of ``https://`` URLs (``http://`` too: a local emulator) through libcurl,
    each answered to the thread that asks: a big file's byte ranges (``read_range``) each
    over a handle of the asking thread (any number idle, each keeping its connection); small
    files whole (``read``, and ``fetch`` ahead of it) and sizes (``size``, ``sizes``) all
    on one thread of the client's, up to ``AT_ONCE`` at a time through libcurl's multi
    interface (a thread per small file cost 3-4 times the CPU, in switches between
    threads). A small reply is handed to a list's own ``append``, no Python between; a
    range's bytes gathered into pieces of ``PIECE`` bytes, each handed to ``into`` when
    full: libcurl hands on a TLS record (16 KiB) at a time, and each handed on to ``into``
    (a ``pwrite``) cost a quarter of a GiB's CPU.

    A size is asked by a GET of the file's first ``PROBE`` bytes, not a HEAD: the reply
    says the size (``Content-Range``), and brings a file of up to ``PROBE`` bytes whole, the
    first ``PROBE`` of a bigger one; those are kept (the last ``KEPT`` files) for ``fetch``
    and ``read``, which ask only for the rest. One request per small file where a HEAD and
    a GET were two. The rest of a file, and each range of a bigger one, is asked only of
    the version the size came with (``If-Range``).

    The rules: ``check(url)`` refuses a host the site has not allowed (https:
    ``allowed_hosts``) before each request; no redirect followed (None, for the caller's
    client, which checks every host it connects to); no proxy, whatever the environment
    says; no protocol but HTTP and HTTPS; TLS verified against the system's CAs and
    ``bundle`` (a site's ``ca_bundle``); a body longer than asked or planned refused
    (``too_much``) as it passes that size, nothing past it handed on; a stall of
    ``TIMEOUT`` seconds ends the request; errors name the path, never the URL. URLs are
    given as fsspec encodes them. The thread ends when it has had nothing to do for
    ``IDLE`` seconds, or at ``close``."""

    def __init__(
        self, bundle: str | None = None, check: Callable[[str], None] = lambda url: None
    ) -> None:
        if pycurl.version_info()[2] < 0x080400:  # MAXFILESIZE midway (8.4.0)
            raise TransferError(
                f"HTTPS reads need libcurl 8.4 or newer; pycurl has {pycurl.version}:"
                " install pycurl's wheel (pip install --only-binary pycurl pycurl)",
                permanent=True,
            )
        self._check = check
        self._cas = _ca_blob(bundle)
        self._lock = threading.Lock()
        self._more = threading.Condition(self._lock)  # a request waits, or close
        self._waiting: collections.deque[_Request] = collections.deque()
        # files read ahead (fetch): url -> (planned size, their first bytes, those bytes'
        # validator, the rest's GET)
        self._ahead: dict[str, _Ahead] = {}
        # the first bytes of files whose size was asked, oldest first: url -> (size, the
        # bytes, the reply's validator: the rest is asked only if the file is still that one)
        self._kept: collections.OrderedDict[str, tuple[int, list[bytes], bytes]] = (
            collections.OrderedDict()
        )
        # bigger files, the last VERSIONS whose size was asked: url -> (that size, the
        # version it came with); each range is asked only of that version (If-Range), and
        # must be of a file of that size
        self._versions: collections.OrderedDict[str, tuple[int, bytes]] = collections.OrderedDict()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._easy: list[pycurl.Curl] = []  # idle handles of ranges

    def read_range(self, url: str, name: str, start: int, end: int, into: Into) -> int | None:
        """Bytes ``start`` to ``end`` into ``into`` as they come, in this thread; the number
        of bytes read. A reply that is not the range (a 200: the whole file) is refused
        before a byte is handed on; a body longer than the range, after its last byte
        (``too_much``). A file whose size was asked here is read only in the version it
        had (``If-Range``) and at that size (``Content-Range``): changed since, a range is
        answered whole, or of another size, and refused, transiently, never staged of two
        versions nor at a size it no longer has. The next try asks the version the refused
        reply named: a file changed in place, its size kept, is read again whole."""
        self._check(url)
        reply = _Range(start, into)
        with self._lock:
            curl = self._easy.pop() if self._easy else self._handle(PIECE)
            planned, since = self._versions.get(url, (None, b""))
        code, text = None, ""
        try:
            curl.setopt(pycurl.URL, url)
            curl.setopt(pycurl.RANGE, f"{start}-{end - 1}")
            if since:
                curl.setopt(pycurl.HTTPHEADER, [b"If-Range: " + since])
            else:
                curl.unsetopt(pycurl.HTTPHEADER)
            curl.setopt(pycurl.MAXFILESIZE_LARGE, end - start)  # stopped at its last byte
            curl.setopt(pycurl.HEADERFUNCTION, reply.header)
            curl.setopt(pycurl.WRITEFUNCTION, reply.body)
            try:
                curl.perform()
            except pycurl.error as exc:
                code, text = exc.args[0], str(exc.args[1])
            reply.flush()
            status = int(curl.getinfo(pycurl.RESPONSE_CODE))
        finally:
            curl.setopt(pycurl.WRITEFUNCTION, _nothing)
            curl.unsetopt(pycurl.HEADERFUNCTION)
            with self._lock:
                self._easy.append(curl)
        cut = code == pycurl.E_FILESIZE_EXCEEDED  # longer than the range (or than a 200's)
        if cut and status == 206:
            raise too_much(name, end - start)
        if code is not None and not (reply.refused or cut):
            raise _curl_error(code, text, name)
        if 300 <= status < 400:
            return None
        if planned is not None and status in (200, 206):
            self._same_file(url, name, planned, since, status, _fields(reply.lines))
        judge(status, _reason(status), name, ranged=True)
        return reply.at - start

    def _same_file(
        self,
        url: str,
        name: str,
        planned: int,
        since: bytes,
        status: int,
        fields: dict[bytes, list[bytes]],
    ) -> None:
        """Refuse a reply to a range of ``url`` (of ``planned`` bytes, version ``since``,
        when its size was asked) that shows the file changed since: sent whole
        (``If-Range``: another version; the next try asks the version this reply names),
        or a range of a file of another size. (A 200 without ``If-Range`` is ``judge``'s.)"""
        if status == 200 and since:
            with self._lock:
                self._versions[url] = (planned, _validator(fields))
            raise Changed(name, f"HTTP {status}, not the range")
        if status == 206:
            of_size(fields.get(b"content-range", []), name, planned)

    def read(self, url: str, name: str, size: int) -> bytes | None:
        """The whole body, planned at ``size`` bytes: the first bytes its size's request
        brought and the rest (the GET ``fetch`` started, if it did), or all of it in one
        GET; a longer one is refused (``too_much``), never gathered whole. The rest must
        come as the range asked for (206), of the same file (``If-Range``: a file changed
        since its first bytes came is answered whole), else it is refused, transiently: the
        next try reads the file whole."""
        with self._lock:
            ahead = self._ahead.pop(url, None) or self._first(url, size)
        _, first, since, future = (
            ahead if ahead is not None and ahead[0] == size else (size, [], b"", None)
        )
        got = _count(first)
        if got == size:
            return b"".join(first)
        status, chunks = (future or self._rest(url, name, size, got, since)).result()
        if 300 <= status < 400:
            return None
        if status >= 400:
            judge(status, _reason(status), name, ranged=False)
        if first and status != 206:  # If-Range: a file changed since is sent whole
            raise Changed(name, f"HTTP {status}, not the rest")
        return b"".join([*first, *chunks])

    def fetch(self, url: str, name: str, size: int) -> None:
        """Start reading a small file now (what its size's request did not bring), for
        ``read`` to take. A hint: a host the site has not allowed, as any failure, is left
        to ``read``, which refuses it."""
        with self._lock:
            kept = self._first(url, size)
        _, first, since, _ = kept if kept is not None else (size, [], b"", None)
        got = _count(first)
        try:
            future = None if got == size else self._rest(url, name, size, got, since)
        except TransferError:
            return
        with self._lock:
            self._ahead[url] = (size, first, since, future)

    def size(self, url: str, name: str) -> int | None:
        """The size the reply to a GET of the first ``PROBE`` bytes says plainly
        (``_probed``), its bytes kept; None for a redirect, a refusal or a reply that says
        none: the caller asks fsspec's client, which follows a redirect and tries a GET
        where a HEAD tells nothing."""
        return next(self.sizes([(url, name)]))

    def sizes(self, asked: Iterable[tuple[str, str]]) -> Iterator[int | None]:
        """``size`` of each (url, name), in order, each answered as it comes; the first
        error raised. ``AHEAD`` are asked ahead of the one answered: a file's GET that
        ``fetch`` started as its size came waits behind that many, not all. The first bytes
        each brought are kept, the last ``KEPT`` (twice ``AHEAD``: a caller that takes each
        size and then fetches the file finds its bytes still kept); the version of each
        bigger one a server answered with a range, the last ``VERSIONS``, for ``read_range``."""
        left = iter(asked)
        asking = collections.deque(self._probe(u, n) for u, n in islice(left, AHEAD))
        while asking:
            request = asking.popleft()
            status, body = request.future.result()
            size, first, since = _probed(status, body, request.head or [])
            asking.extend(self._probe(u, n) for u, n in islice(left, 1))
            got = _count(first) if first is not None else 0
            if size is not None and first is not None and (got == size or since):
                with self._lock:
                    keep(self._kept, request.url, (size, first, since), KEPT)
                    if got < size and status == 206:  # for its ranges
                        keep(self._versions, request.url, (size, since), VERSIONS)
            yield size

    def close(self) -> None:
        """Stop the thread; requests not answered yet fail, files fetched are dropped."""
        with self._lock:
            self._closed = True
            self._ahead.clear()
            self._kept.clear()
            self._versions.clear()
            self._more.notify()
            easy, self._easy = self._easy, []
        for curl in easy:
            curl.close()

    def _first(self, url: str, size: int) -> _Ahead | None:
        """The first bytes kept of ``url`` (its size asked) and their validator, if it
        still has ``size`` bytes, no GET started; under the lock."""
        kept = self._kept.pop(url, None)
        return (*kept, None) if kept is not None and kept[0] == size else None

    def _probe(self, url: str, name: str) -> _Request:
        """A size's request: a GET of the first ``PROBE`` bytes, its header lines kept."""
        return self._submit(_Request(url, name, PROBE, start=0, head=[]))

    def _rest(
        self, url: str, name: str, size: int, got: int, since: bytes
    ) -> Future[tuple[int, list[bytes]]]:
        """The GET of what a file of ``size`` bytes lacks after the first ``got``: all of
        it, or the range after them, if the file is still the one ``since`` (their
        validator) names."""
        request = _Request(url, name, size - got, start=got or None, since=since)
        return self._submit(request).future

    def _submit(self, request: _Request) -> _Request:
        self._check(request.url)
        with self._lock:
            if self._closed:
                raise TransferError(f"{request.name}: the reads of this transfer have ended")
            self._waiting.append(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="curl", daemon=True)
                self._thread.start()
            if len(self._waiting) == 1:  # the thread waits only with none waiting
                self._more.notify()
        return request

    def _run(self) -> None:
        """The thread: start what waits (up to ``AT_ONCE`` running), let libcurl move
        every running request on, answer the ended ones."""
        multi = pycurl.CurlMulti()
        free: list[pycurl.Curl] = []
        running: dict[pycurl.Curl, _Request] = {}
        starting: list[_Request] = []
        left: list[_Request] = []
        failure: BaseException = TransferError("the reads of this transfer have ended")
        try:
            while True:
                with self._lock:
                    if not running and not self._waiting and not self._closed:
                        self._more.wait(IDLE)
                    if self._closed or not (running or self._waiting):
                        self._thread = None
                        left = [*running.values(), *self._waiting]
                        self._waiting.clear()
                        return
                    starting = [
                        self._waiting.popleft()
                        for _ in range(min(AT_ONCE - len(running), len(self._waiting)))
                    ]
                for request in starting:
                    curl = free.pop() if free else self._handle()
                    request.start(curl)
                    multi.add_handle(curl)
                    running[curl] = request
                while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                    pass
                more = True
                while more:
                    more, done, failed = multi.info_read()
                    for curl, code, text in [(c, None, "") for c in done] + failed:
                        multi.remove_handle(curl)
                        running[curl].finish(curl, code, text)  # (a failure here: in left)
                        del running[curl]
                        free.append(curl)
                if running:
                    multi.select(WAIT)
        except BaseException as exc:  # a bug here: no caller may wait for ever
            failure = exc
            with self._lock:
                self._thread = None
                left = [*starting, *running.values(), *self._waiting]
                self._waiting.clear()
        finally:
            for request in left:
                if not request.future.done():
                    request.future.set_exception(failure)
            for curl in [*free, *running]:
                curl.close()
            multi.close()

    def _handle(self, buffer: int = 0) -> pycurl.Curl:
        """A handle with the client's rules; ``buffer``: libcurl's, if not its own."""
        curl = pycurl.Curl()
        if buffer:
            curl.setopt(pycurl.BUFFERSIZE, buffer)
        curl.setopt(pycurl.NOSIGNAL, True)  # threads: no SIGALRM for resolver timeouts
        curl.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        curl.setopt(pycurl.FOLLOWLOCATION, False)
        curl.setopt(pycurl.PROXY, "")  # not http_proxy, https_proxy, all_proxy
        curl.setopt(pycurl.NETRC, pycurl.NETRC_IGNORED)
        curl.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        curl.setopt(pycurl.PATH_AS_IS, True)  # the path as fsspec encoded it
        curl.setopt(pycurl.TCP_NODELAY, True)
        curl.setopt(pycurl.CONNECTTIMEOUT, int(TIMEOUT))
        curl.setopt(pycurl.LOW_SPEED_LIMIT, 1)  # less than a byte a second ...
        curl.setopt(pycurl.LOW_SPEED_TIME, int(TIMEOUT))  # ... for this long: ended
        curl.setopt(pycurl.SSL_VERIFYPEER, True)
        curl.setopt(pycurl.SSL_VERIFYHOST, 2)
        if self._cas:
            curl.setopt(pycurl.CAINFO_BLOB, self._cas)
        else:  # none but the directory's
            curl.setopt(pycurl.CAINFO, None)
        curl.setopt(pycurl.CAPATH, system_cas()[1])
        return curl


_WEIRD = 8  # CURLE_WEIRD_SERVER_REPLY: a header libcurl refuses (Content-Length: +7)
AHEAD = 32  # sizes asked ahead of the size answered (BlockingClient.sizes)
KEPT = 2 * AHEAD  # files whose first bytes are kept for a read (BlockingClient.sizes)
VERSIONS = 16384  # bigger files whose version is kept for their ranges (about 4 MiB)
PROBE = 64 << 10  # bytes a size's request asks for: a file this small comes whole with it
AT_ONCE = 16  # requests in flight at once (sizes, files), as rclone's --checkers
IDLE = 1.0  # seconds without a request before the thread of a BlockingClient ends
WAIT = 0.005  # seconds libcurl waits for its sockets before new requests are started


class _Request:
    """One GET of at most ``most`` bytes, from ``start`` on (a range; None: the whole
    file; ``since``: only if the file is still the one this validator names, else the
    whole file, ``If-Range``), its body gathered, and its header lines in ``head`` if given
    (a size's request); its ``future``: (status, the body's pieces), or the error."""

    __slots__ = ("url", "name", "most", "start_at", "head", "since", "future", "gathered")

    def __init__(
        self,
        url: str,
        name: str,
        most: int,
        start: int | None = None,
        head: list[bytes] | None = None,
        since: bytes = b"",
    ) -> None:
        self.url, self.name, self.most, self.start_at, self.head = url, name, most, start, head
        self.since = since
        self.future: Future[tuple[int, list[bytes]]] = Future()
        self.gathered: list[bytes] = []

    def start(self, curl: pycurl.Curl) -> None:
        curl.setopt(pycurl.URL, self.url)
        if self.start_at is None:
            curl.unsetopt(pycurl.RANGE)
        else:
            curl.setopt(pycurl.RANGE, f"{self.start_at}-{self.start_at + self.most - 1}")
        if self.since:
            curl.setopt(pycurl.HTTPHEADER, [b"If-Range: " + self.since])
        else:
            curl.unsetopt(pycurl.HTTPHEADER)
        if self.head is not None:
            curl.setopt(pycurl.HEADERFUNCTION, self.head.append)
        curl.setopt(pycurl.WRITEFUNCTION, self.gathered.append if self.most else _nothing)
        curl.setopt(pycurl.MAXFILESIZE_LARGE, self.most)  # 0: no limit, hence _nothing

    def finish(self, curl: pycurl.Curl, code: int | None, text: str) -> None:
        """Answer the request, from the status and libcurl's error ``code`` (None: none)."""
        curl.setopt(pycurl.WRITEFUNCTION, _nothing)  # the idle handle keeps no body
        curl.unsetopt(pycurl.HEADERFUNCTION)
        status = int(curl.getinfo(pycurl.RESPONSE_CODE))
        over = code in (pycurl.E_FILESIZE_EXCEEDED, pycurl.E_WRITE_ERROR)
        sizing = self.head is not None
        whole = over and status == 200 and self.since  # changed since: sent whole (If-Range)
        if code is None or (over and (status >= 300 or sizing)) or whole:  # judged by the caller
            self.future.set_result((status, self.gathered))
        elif sizing and (code == _WEIRD or status):  # a reply not read to its end: no size
            self.future.set_result((0, []))
        elif over:
            self.future.set_exception(too_much(self.name, self.most))
        else:
            self.future.set_exception(_curl_error(code, text, self.name))


class _Range:
    """What libcurl hands of one ranged reply: its header ``lines`` and status, then
    its body, on to ``into`` in pieces of ``PIECE`` bytes (``flush``: the last), if it is a
    206 (``refused`` if not: nothing handed on).
    libcurl itself stops a body at the range's length (``MAXFILESIZE``), before a byte
    past it is handed on."""

    __slots__ = ("at", "into", "lines", "status", "refused", "piece")

    def __init__(self, start: int, into: Into) -> None:
        self.at, self.into = start, into
        self.lines: list[bytes] = []
        self.status = 0
        self.refused = False
        self.piece = bytearray()

    def header(self, line: bytes) -> None:
        self.lines.append(line)
        if line.startswith(b"HTTP/"):  # the last reply's (after a 100 Continue)
            status = line.split(None, 2)[1:2]
            self.status = int(status[0]) if status and status[0].isdigit() else 0

    def body(self, data: bytes) -> int | None:
        if self.status != 206:
            self.refused = True
            return 0
        self.piece += data
        if len(self.piece) >= PIECE:
            self.flush()
        return None

    def flush(self) -> None:
        """Hand on the bytes gathered (after the last piece, by ``read_range``)."""
        if self.piece:
            piece, self.piece = self.piece, bytearray()
            self.into(self.at, piece)
            self.at += len(piece)


def _probed(
    status: int, body: list[bytes], lines: list[bytes]
) -> tuple[int | None, list[bytes] | None, bytes]:
    """What the reply to a size's request (``PROBE`` bytes from 0) says: the file's size,
    said plainly, its first bytes (``body``: all of them, for a file of up to ``PROBE``),
    or None, and the validator that names this version of it (``_validator``; b"" if
    none). A 206 names the size in ``Content-Range: bytes 0-E/SIZE``, its body bytes 0 to
    E; a 200 (a server that ignores ``Range``) in its ``Content-Length``, its body the file
    if it came whole. Plainly: one ``Content-Length`` of at most 18 ASCII digits, of a body
    sent as is, the number of bytes that came; anything else is (None, None, b"")."""
    fields = _fields(lines)
    given = fields.get(b"content-length", [])
    coding = fields.get(b"content-encoding", [])
    if not (
        len(given) == 1 and _DIGITS.fullmatch(given[0]) and coding in ([], [b"identity"], [b""])
    ):
        return None, None, b""
    length, came, since = int(given[0]), _count(body), _validator(fields)
    if status == 200:
        return length, body if came == length else None, since
    ranges = fields.get(b"content-range", [])
    said = _RANGE.fullmatch(ranges[0]) if status == 206 and len(ranges) == 1 else None
    if said is None or came != length or int(said[1]) + 1 != length:
        return None, None, b""
    size = int(said[2])
    return (size, body, since) if length <= size else (None, None, b"")


def _count(pieces: list[bytes]) -> int:
    """The bytes in ``pieces``."""
    return sum(map(len, pieces))


def _fields(lines: list[bytes]) -> dict[bytes, list[bytes]]:
    """The header fields of the last reply in ``lines`` (after a 100 Continue), by
    lower-case name, each name's values in order."""
    head = lines
    for at, line in enumerate(lines):
        if line.startswith(b"HTTP/"):
            head = lines[at + 1 :]
    fields: dict[bytes, list[bytes]] = {}
    for line in head:
        key, _, value = line.partition(b":")
        fields.setdefault(key.strip().lower(), []).append(value.strip())
    return fields


def _validator(fields: dict[bytes, list[bytes]]) -> bytes:
    """What names this version of the file, for ``If-Range``: its strong ``ETag``, else its
    ``Last-Modified`` date, each only in its plain form (nothing else is sent back); b""
    if none."""
    for name, form in ((b"etag", _ETAG), (b"last-modified", _DATE)):
        values = fields.get(name, [])
        if len(values) == 1 and form.fullmatch(values[0]):
            return values[0]
    return b""


_DIGITS = re.compile(rb"[0-9]{1,18}")
_RANGE = re.compile(rb"bytes 0-([0-9]{1,18})/([0-9]{1,18})")  # from 0, as asked
_ANY_RANGE = re.compile(rb"bytes [0-9]{1,18}-[0-9]{1,18}/([0-9]{1,18})")  # its file's size
_ETAG = re.compile(rb'"[\x21\x23-\x7e]{0,200}"')  # a strong ETag (W/"..." is weak)
_DATE = re.compile(
    rb"[A-Z][a-z]{2}, [0-9]{2} [A-Z][a-z]{2} [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT"
)


def _nothing(data: bytes) -> int:
    """A body not wanted (or a file planned empty): refused at its first byte."""
    return 0


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def _ca_blob(bundle: str | None) -> bytes:
    """The CA files ``tls_context`` trusts, for libcurl (the directory is its
    ``CAPATH``): the system's, if it is read (``system_cas``), and the site's ``bundle``."""
    blob = b""
    for path in (system_cas()[0], bundle):
        if path:
            with open(path, "rb") as f:
                blob += f.read() + b"\n"
    return blob


def _curl_error(code: int, text: str, name: str) -> Exception:
    """A libcurl failure as ``BlockingClient``'s would be: an untrusted certificate as
    ``ssl.SSLCertVerificationError`` (permanent, errors.py); a URL or protocol libcurl
    refuses, permanent; anything else transient. The path named, never the URL."""
    if code == pycurl.E_PEER_FAILED_VERIFICATION:
        return ssl.SSLCertVerificationError(f"{name}: {text}")
    permanent = code in (pycurl.E_UNSUPPORTED_PROTOCOL, pycurl.E_URL_MALFORMAT)
    return TransferError(f"{name}: {text} (libcurl error {code})", permanent=permanent)
