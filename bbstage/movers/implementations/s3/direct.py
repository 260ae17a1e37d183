"""Big GETs straight into the file: one HTTP connection per streamed GET or range, read by
the event loop (an ``asyncio.BufferedProtocol``: the socket reads into one ``PIECE``-byte
buffer, written at its offset at once), signed by botocore (SigV4, the credentials
``FastS3`` resolved). No chunk of the body becomes a Python object and a piece is still in
the CPU's cache when it is written: for 1 GiB about half obstore's client CPU. All GETs of
a transfer share one thread, the loop's: with a thread per range, the threads' turns at
the GIL cost up to four times the CPU (0.6-2.9 s for 1 GiB from RGW in four ranges,
against 0.6-0.8 s in the loop; docs/performance.md), and with client and store on the
same CPUs, client CPU is throughput. Used where ``FastS3`` is (a site's endpoint,
path-style) and no proxy is configured for the endpoint, for downloads without
``checksum=``. HEADs and LIST pages (``answered``) are answered whole in a thread.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import re
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from bbstage.movers.base import Progress, TransferError
from bbstage.movers.implementations.s3.fast import FastS3

PIECE = 128 << 10  # bytes per read and write (64 KiB, 512 KiB cost more CPU; <= download._WRITE)
_REPORT = 8 << 20  # progress is added every this many bytes
_HEAD_MAX = 64 << 10  # an answer's status line and headers, and an error answer's body
_CODE = re.compile(rb"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]*)</Message>")
_RANGE = re.compile(r"bytes (\d+)-")

Check = Callable[[dict[str, Any]], None]
Write = Callable[[int, memoryview, int], None]


class Reached:
    """How far a GET wrote: the offset after its last byte in the file."""

    def __init__(self, pos: int) -> None:
        self.pos = pos


class DirectGet:
    """GETs of byte ranges written straight into a file (see the module's docstring)."""

    def __init__(self, fast: FastS3) -> None:
        self._fast = fast
        # GETs (each a connection) at once in the transfer: every range of every big object
        # in flight, so ``files_in_flight`` x ``download_concurrency`` without it.
        self._slots = asyncio.Semaphore(fast.settings.max_pool_connections)

    @staticmethod
    def available(endpoint: str) -> bool:
        """No proxy configured for ``endpoint`` (this client would not use it)."""
        url = urllib.parse.urlsplit(endpoint)
        proxied = url.scheme in urllib.request.getproxies()
        return not proxied or bool(urllib.request.proxy_bypass(url.hostname or ""))

    async def get(
        self,
        bucket: str,
        key: str,
        fd: int,
        reached: Reached,
        end: int | None,
        check: Check,
        progress: Progress,
        write: Write,
    ) -> None:
        """Bytes ``reached.pos``..``end - 1`` of the object (``end`` None: the whole object,
        no Range) into ``fd`` at their offsets; ``check`` sees the answer's ``ETag`` and
        ``ContentLength`` first. On any error ``reached`` says how far it got. Nothing is
        written once this returns or raises, also when cancelled, so the caller may close
        ``fd`` at once. At most ``max_pool_connections`` at once."""
        fast, settings = self._fast, self._fast.settings
        async with self._slots:
            creds = await fast.credentials()
            url = object_url(fast, bucket, key)
            headers = {} if end is None else {"Range": f"bytes={reached.pos}-{end - 1}"}
            target, headers = signed(fast, url, headers, creds)
            what = f"s3://{bucket}/{key}"
            answer = _Answer(fast, what, fd, reached, end, check, progress, write)
            try:
                transport = await _connect(fast, answer, what)
                transport.write(_request(url, target, headers))
                while not answer.done.done():
                    left = settings.read_timeout - (time.monotonic() - answer.last)
                    if left <= 0:
                        raise connection_failed(fast, TimeoutError("read timed out"), what)
                    await asyncio.wait({answer.done}, timeout=left)
                answer.done.result()
            finally:
                answer.close()


class _Answer(asyncio.BufferedProtocol):
    """One GET's answer as it arrives: its head parsed and ``check``-ed, then its body
    written at its offsets (an error answer's body is kept for ``client_error``).
    ``done`` holds the outcome; after ``close`` nothing more is written."""

    def __init__(
        self,
        fast: FastS3,
        url: str,
        fd: int,
        reached: Reached,
        end: int | None,
        check: Check,
        progress: Progress,
        write: Write,
    ) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.last = time.monotonic()  # when bytes last arrived (the read timeout's clock)
        self._fast, self._url, self._end = fast, url, end
        self._fd, self._reached = fd, reached
        self._check, self._progress, self._write = check, progress, write
        self._buf = memoryview(bytearray(PIECE))
        self._head: bytearray | None = bytearray()  # None once parsed
        self._status, self._want, self._unreported = 0, 0, 0
        self._error_body, self._chunked = bytearray(), False
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buf

    def buffer_updated(self, nbytes: int) -> None:
        self.last = time.monotonic()
        if self.done.done():
            return
        try:
            data = self._buf[:nbytes]
            if self._head is not None:
                data = self._parse_head(data)
            if data:
                self._take(data)
        except BaseException as exc:  # raised by ``get``: check's, write's, or ours
            self._end_with(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        if self._head is not None:
            self._end_with(exc or ConnectionResetError("closed before answering"))
        elif self._status not in (200, 206):
            self._end_with(self._refusal())
        elif exc is not None:
            self._end_with(exc)
        else:
            at = self._reached.pos
            self._end_with(TransferError(f"{self._url}: short read at byte {at}", permanent=False))

    def close(self) -> None:
        """Stop: no byte is written after this (the socket is closed at once)."""
        if not self.done.done():
            self.done.set_result(None)  # nobody awaits it any more
        elif not self.done.cancelled():
            self.done.exception()  # seen (an error that came as ``get`` was cancelled)
        if self._unreported:
            self._progress.add(self._unreported)
            self._unreported = 0
        if self._transport is not None:
            self._transport.abort()

    def _refusal(self) -> Exception:
        """The error answer read so far as botocore's ``ClientError`` (chunks decoded)."""
        body = bytes(self._error_body)
        return client_error(self._status, _unchunked(body) if self._chunked else body, "GetObject")

    def _end_with(self, exc: BaseException) -> None:
        if isinstance(exc, (OSError, http.client.HTTPException)):  # ``write`` raises its own
            exc = connection_failed(self._fast, exc, self._url)
        self.done.set_exception(exc)

    def _parse_head(self, data: memoryview) -> memoryview:
        """Add ``data`` to the head; once it is whole: check it, return the body's bytes
        that came with it."""
        assert self._head is not None
        self._head += data
        cut = self._head.find(b"\r\n\r\n")
        if cut < 0:
            if len(self._head) > _HEAD_MAX:
                raise http.client.LineTooLong("answer head")
            return data[:0]
        line, _, rest = bytes(self._head[:cut]).partition(b"\r\n")
        body = memoryview(bytes(self._head[cut + 4 :]))
        self._head = None
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise http.client.BadStatusLine(line.decode(errors="replace"))
        self._status = int(parts[1])
        head = http.client.parse_headers(io.BytesIO(rest + b"\r\n\r\n"))
        length = int(head.get("Content-Length", -1))
        if self._status not in (200, 206):
            self._want = min(length, _HEAD_MAX) if length >= 0 else _HEAD_MAX
            self._chunked = length < 0 and "chunked" in head.get("Transfer-Encoding", "").lower()
            if not self._want:  # no body to wait for (the connection stays open)
                raise self._refusal()
            return body
        if self._end is not None:
            self._check_range(head.get("Content-Range"), length)
        if length < 0:
            raise TransferError(
                f"{self._fast.endpoint} answered a GET without Content-Length: {self._url}",
                permanent=False,
            )
        self._check({"ETag": head.get("ETag"), "ContentLength": length})
        self._want = length if self._end is None else self._end - self._reached.pos
        if not self._want:
            self.done.set_result(None)
        return body

    def _check_range(self, content_range: str | None, length: int) -> None:
        """A ranged GET's answer is the range asked for, all of it."""
        assert self._end is not None
        start, count = self._reached.pos, self._end - self._reached.pos
        got = _RANGE.match(content_range or "")
        if self._status != 206 or got is None:
            raise TransferError(f"{self._fast.endpoint} ignored the Range of a GET: {self._url}")
        if int(got.group(1)) != start or length != count:
            raise TransferError(
                f"{self._fast.endpoint} answered {content_range} ({length} bytes) for a GET of"
                f" {count} bytes at {start}: {self._url}",
                permanent=False,
            )

    def _take(self, data: memoryview) -> None:
        """Body bytes: written at their offset (an error answer's: kept)."""
        if self._status not in (200, 206):
            body = self._error_body
            body += data[: self._want - len(body)]
            if len(body) >= self._want or (self._chunked and body.endswith(b"0\r\n\r\n")):
                raise self._refusal()  # whole (a chunked one: its last chunk came)
            return
        data = data[: self._want]
        self._write(self._fd, data, self._reached.pos)
        n = len(data)
        self._reached.pos += n
        self._want -= n
        self._unreported += n
        if self._unreported >= _REPORT:
            self._progress.add(self._unreported)
            self._unreported = 0
        if not self._want:
            self.done.set_result(None)


def _unchunked(body: bytes) -> bytes:
    """The data of a chunked body (as far as it is well-formed)."""
    data, at = bytearray(), 0
    while (eol := body.find(b"\r\n", at)) > at:
        try:
            size = int(body[at:eol].split(b";")[0], 16)
        except ValueError:
            break
        if not size:
            break
        data += body[eol + 2 : eol + 2 + size]
        at = eol + 2 + size + 2
    return bytes(data)


async def _connect(fast: FastS3, answer: _Answer, what: str) -> asyncio.BaseTransport:
    """A connection to ``fast``'s endpoint read by ``answer``; TLS as ``[s3] verify`` says.
    A refused, unroutable or timed-out connection is ``Unreachable``."""
    settings, endpoint = fast.settings, urllib.parse.urlsplit(fast.endpoint)
    context = _tls(fast) if endpoint.scheme == "https" else None
    port = endpoint.port or (443 if context else 80)
    loop = asyncio.get_running_loop()
    try:
        transport, _ = await asyncio.wait_for(
            loop.create_connection(
                lambda: answer,
                endpoint.hostname,
                port,
                ssl=context,
                ssl_handshake_timeout=settings.connect_timeout if context else None,
            ),
            settings.connect_timeout,
        )
    except ssl.SSLError as exc:  # reached, but its certificate or TLS refused: said as it is
        raise connection_failed(fast, exc, what) from None
    except OSError as exc:  # TimeoutError too
        raise connection_failed(fast, Unreachable(*exc.args), what) from None
    return transport


def _request(url: str, target: str, headers: dict[str, str]) -> bytes:
    """A GET for ``target`` with the signed ``headers``, and the ``Host`` SigV4 signed."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.removesuffix({"http": ":80", "https": ":443"}[parts.scheme])
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def answered(
    fast: FastS3, url: str, what: str, operation: str, method: str = "GET"
) -> tuple[http.client.HTTPResponse, bytes]:
    """A request without a body for ``url`` (on ``fast``'s endpoint), signed and answered
    whole in a thread: the answer (its status and headers) and its body. An error answer
    is raised as botocore's ``ClientError`` for ``operation``, a failed connection as
    ``connection_failed`` words it (``what``: the ``s3://`` URL the messages name)."""
    creds = await fast.credentials()
    target, headers = signed(fast, url, {}, creds, method)
    return await asyncio.to_thread(_answered, fast, target, headers, method, what, operation)


def _answered(
    fast: FastS3, target: str, headers: dict[str, str], method: str, what: str, operation: str
) -> tuple[http.client.HTTPResponse, bytes]:
    conn = connection(fast)
    try:
        resp = send(fast, conn, target, headers, method)
        body = resp.read()  # a HEAD's answer: none
    except (OSError, http.client.HTTPException) as exc:
        raise connection_failed(fast, exc, what) from None
    finally:
        conn.close()
    if resp.status != 200:
        raise client_error(resp.status, body, operation)
    return resp, body


def object_url(fast: FastS3, bucket: str, key: str) -> str:
    """The URL of an object on ``fast``'s endpoint (path-style), quoted as SigV4 signs it."""
    base = fast.endpoint.rstrip("/")
    return f"{base}/{urllib.parse.quote(bucket)}/{urllib.parse.quote(key, safe='/~')}"


def signed(
    fast: FastS3,
    url: str,
    headers: dict[str, str],
    creds: tuple[str, str, str | None],
    method: str = "GET",
) -> tuple[str, dict[str, str]]:
    """A request for ``url`` (on ``fast``'s endpoint) signed by botocore (SigV4): the path
    and query to send, and the headers."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method=method, url=url, headers=headers)
    S3SigV4Auth(Credentials(*creds), "s3", fast.region).add_auth(request)
    parts = urllib.parse.urlsplit(url)
    target = f"{parts.path}?{parts.query}" if parts.query else parts.path
    return target, dict(request.headers.items())


def connection(fast: FastS3) -> http.client.HTTPConnection:
    """A connection (not yet open) to ``fast``'s endpoint, with its TLS settings."""
    settings, endpoint = fast.settings, urllib.parse.urlsplit(fast.endpoint)
    timeout = settings.connect_timeout
    if endpoint.scheme != "https":
        return http.client.HTTPConnection(endpoint.hostname, endpoint.port, timeout=timeout)
    return http.client.HTTPSConnection(
        endpoint.hostname, endpoint.port, timeout=timeout, context=_tls(fast)
    )


def _tls(fast: FastS3) -> ssl.SSLContext:
    """The TLS settings of ``[s3] verify``: the system's CAs, a CA bundle, or none."""
    verify = fast.settings.verify
    context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
    if verify is False:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def send(
    fast: FastS3,
    conn: http.client.HTTPConnection,
    target: str,
    headers: dict[str, str],
    method: str = "GET",
) -> http.client.HTTPResponse:
    """Open ``conn``, send the request for ``target`` (from ``signed``), return the
    answer's head; reads time out after ``[s3] read_timeout``."""
    try:
        conn.connect()
    except ssl.SSLError:
        raise  # reached, but its certificate or TLS refused: said as it is
    except OSError as exc:
        raise Unreachable(*exc.args) from exc
    assert conn.sock is not None
    conn.sock.settimeout(fast.settings.read_timeout)
    conn.request(method, target, headers=headers)
    return conn.getresponse()


class Unreachable(ConnectionError):
    """The endpoint did not take the connection (refused, no route, timed out, no name)."""


def connection_failed(fast: FastS3, exc: BaseException, url: str) -> TransferError:
    """A socket or HTTP error of a request for ``url``: transient, worded as botocore's
    are (``errors.translate``)."""
    if isinstance(exc, Unreachable):
        where = fast.endpoint
        return TransferError(f"S3 endpoint not reachable: {where} (for {url})", permanent=False)
    return TransferError(
        f"connection to S3 endpoint {fast.endpoint} failed ({type(exc).__name__}): {url}",
        permanent=False,
    )


def client_error(status: int, body: bytes, operation: str) -> Exception:
    """An error answer as botocore's ``ClientError`` (``errors.translate`` words it)."""
    from botocore.exceptions import ClientError

    code = _CODE.search(body)
    message = _MESSAGE.search(body)
    error = {
        "Code": code.group(1).decode(errors="replace") if code else str(status),
        "Message": message.group(1).decode(errors="replace") if message else "",
    }
    return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}, operation)
