"""Big GETs straight into the file: one HTTP connection per streamed GET or range, in a
thread of its own, signed by botocore (SigV4, the credentials ``FastS3`` resolved), its body
read with ``readinto`` into one ``PIECE``-byte buffer and written at its offset. No chunk of
the body becomes a Python object, and a piece is still in the CPU's cache when it is
written: for 1 GiB this took about half obstore's client CPU (0.57 s against 1.25 s, and
s5cmd's 0.92 s; docs/performance.md), and with client and store on the same CPUs, client
CPU is throughput. Used where ``FastS3`` is (a site's endpoint, path-style) and no proxy
is configured for the endpoint, for downloads without ``checksum=``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import re
import socket
import ssl
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from bbstage.movers.base import Progress, TransferError
from bbstage.movers.implementations.s3.fast import FastS3

PIECE = 128 << 10  # bytes per read and write (64 KiB cost more CPU; at most download._WRITE)
_REPORT = 8 << 20  # progress is handed to the event loop every this many bytes
_CODE = re.compile(rb"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(rb"<Message>([^<]*)</Message>")

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
        self._lock = threading.Lock()  # around ``check``: ranges answer in threads at once
        # GETs (each a thread and a connection) at once in the transfer: every range of
        # every big object in flight, so ``files_in_flight`` x ``download_concurrency``
        # without it.
        self._slots = asyncio.Semaphore(fast.settings.max_pool_connections)

    @staticmethod
    def available(endpoint: str) -> bool:
        """No proxy configured for ``endpoint`` (http.client would not use it)."""
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
        ``ContentLength`` first. On any error ``reached`` says how far it got. The thread
        is stopped and joined before this returns or raises, also when cancelled, so the
        caller may close ``fd`` at once. At most ``max_pool_connections`` at once."""
        async with self._slots:
            creds = await self._fast.credentials()
            url = object_url(self._fast, bucket, key)
            headers = {} if end is None else {"Range": f"bytes={reached.pos}-{end - 1}"}
            request = (f"s3://{bucket}/{key}", *signed(self._fast, url, headers, creds))
            loop = asyncio.get_running_loop()
            conn = connection(self._fast)
            stop = threading.Event()

            def report(n: int) -> None:
                loop.call_soon_threadsafe(progress.add, n)

            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            done.set_running_or_notify_cancel()  # a cancelled await must not cancel it: join below

            def run() -> None:
                error: BaseException | None = None
                try:
                    self._fetch(conn, request, fd, reached, end, check, write, report, stop)
                except BaseException as exc:
                    error = exc
                conn.close()
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

            threading.Thread(target=run, name="s3-get", daemon=True).start()
            try:
                await asyncio.wrap_future(done)
            except BaseException:
                stop.set()
                while not done.done():  # a blocked read returns once its socket is shut down
                    sock = conn.sock  # None until connected (bounded by connect_timeout)
                    if sock is not None:
                        try:
                            sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                    concurrent.futures.wait([done], timeout=0.05)
                raise

    def _fetch(
        self,
        conn: http.client.HTTPConnection,
        request: tuple[str, str, dict[str, str]],
        fd: int,
        reached: Reached,
        end: int | None,
        check: Check,
        write: Write,
        report: Callable[[int], None],
        stop: threading.Event,
    ) -> None:
        """In the GET's thread: send, check the answer, write the body as it comes."""
        url, path, headers = request
        where = self._fast.endpoint
        try:
            resp = send(self._fast, conn, path, headers)
            if resp.status not in (200, 206):
                raise client_error(resp.status, resp.read(1 << 16), "GetObject")
            if end is not None and resp.status != 206:
                raise TransferError(f"{where} ignored the Range of a GET: {url}")
            length = int(resp.getheader("Content-Length") or -1)
            with self._lock:
                check({"ETag": resp.getheader("ETag"), "ContentLength": length})
            want = length if end is None else end - reached.pos
            view, unreported = memoryview(bytearray(PIECE)), 0
            while want > 0 and not stop.is_set():
                n = resp.readinto(view[: min(PIECE, want)])
                if not n:
                    break
                write(fd, view[:n], reached.pos)
                reached.pos += n
                want -= n
                unreported += n
                if unreported >= _REPORT:
                    report(unreported)
                    unreported = 0
            if unreported:
                report(unreported)
            if want > 0 and not stop.is_set():
                raise TransferError(f"{url}: short read at byte {reached.pos}", permanent=False)
        except (OSError, http.client.HTTPException) as exc:  # ``write`` raises its own
            raise connection_failed(self._fast, exc, url) from None


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
    cafile = settings.verify if isinstance(settings.verify, str) else None
    context = ssl.create_default_context(cafile=cafile)
    if settings.verify is False:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return http.client.HTTPSConnection(
        endpoint.hostname, endpoint.port, timeout=timeout, context=context
    )


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
