"""A fault-injecting HTTP reverse proxy for S3 tests (stdlib only).

``FaultProxy`` listens on 127.0.0.1 in front of an S3 endpoint (RGW from
``scripts/local-s3``) and, for a configurable share of requests:

* ``slowdown``: answers ``503 SlowDown`` with an S3 XML error body (what S3 does
  when throttling); nothing reaches the upstream;
* ``drop``: closes the client connection without any response, either part way
  through the request (after half of its body, or right after its headers) or
  after the upstream executed the request (the client never learns the result);
* ``truncate``: forwards the request and sends the response headers and only
  half of the response body, then closes (a download cut mid-stream).

Everything else is forwarded faithfully: method, path, query and every header
byte for byte (the ``Host`` header included, so SigV4 signatures made for the
proxy's ``host:port`` still validate), bodies streamed in both directions.

Use it as a context manager (it stops on exit; ``stop()`` is idempotent)::

    with FaultProxy(endpoint, slowdown=0.2, drop=0.1, seed=1) as proxy:
        client = make_client(endpoint_url=proxy.url)
        ...
    assert proxy.stats.faults > 0

or by hand: ``python -m tests.s3fault --slowdown 0.2 --drop 0.1 --seed 1``.
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import select
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

CHUNK = 256 * 1024
# Hop-by-hop headers are the proxy's own business; none of them is signed by SigV4
# (botocore never signs Expect, and never sends the others).
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
}

SLOWDOWN_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    "<Resource>{resource}</Resource><RequestId>{request_id}</RequestId></Error>"
)

FAULTS = ("slowdown", "drop_request", "drop_response", "truncate")


@dataclass
class FaultStats:
    """Counters, updated under the proxy's lock."""

    requests: int = 0
    forwarded: int = 0
    slowdown: int = 0
    drop_request: int = 0
    drop_response: int = 0
    truncate: int = 0
    upstream_errors: int = 0
    by_method: dict[str, int] = field(default_factory=dict)

    @property
    def faults(self) -> int:
        """Number of faults injected so far."""
        return self.slowdown + self.drop_request + self.drop_response + self.truncate

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "forwarded": self.forwarded,
            "faults": self.faults,
            **{name: getattr(self, name) for name in FAULTS},
            "upstream_errors": self.upstream_errors,
        }


class _Dropped(Exception):
    """The handler closed the client connection on purpose."""


class _ClientGone(ConnectionError):
    """The client closed its connection part way through a request body."""


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, addr: tuple[str, int], proxy: FaultProxy) -> None:
        self.proxy = proxy
        super().__init__(addr, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 60  # idle keep-alive connections end after this many seconds

    # -- plumbing -----------------------------------------------------------------
    def setup(self) -> None:
        super().setup()
        self.upstream: http.client.HTTPConnection | None = None
        self.expect_continue = False
        self.server.proxy._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.proxy._track(self.connection, add=False)
            if self.upstream is not None:
                self.upstream.close()

    def handle_expect_100(self) -> bool:
        # Decided in _proxy(): a SlowDown is sent instead of "100 Continue", as S3 does.
        self.expect_continue = True
        return True

    def log_message(self, format: str, *args: object) -> None:
        if self.server.proxy.verbose:
            sys.stderr.write(f"[s3fault] {self.address_string()} {format % args}\n")

    def _abort(self) -> None:
        """Close the client connection without a response (RST, not FIN)."""
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close_connection = True
        raise _Dropped

    # -- request body --------------------------------------------------------------
    def _body_length(self) -> int | None:
        """Content-Length, or None for a chunked body."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return None
        return int(self.headers.get("Content-Length") or 0)

    def _body_chunks(self, limit: int | None = None) -> Iterable[bytes]:
        """The request body (de-chunked), at most ``limit`` bytes."""
        length = self._body_length()
        sent = 0
        if length is not None:
            remaining = length if limit is None else min(length, limit)
            while remaining > 0:
                data = self.rfile.read(min(CHUNK, remaining))
                if not data:
                    raise _ClientGone("client closed the connection mid-body")
                remaining -= len(data)
                yield data
            return
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            data = self.rfile.read(size)
            self.rfile.readline()
            sent += len(data)
            yield data
            if limit is not None and sent >= limit:
                return

    def _drain(self) -> None:
        for _ in self._body_chunks():
            pass

    # -- the proxy -------------------------------------------------------------------
    def _proxy(self) -> None:
        proxy = self.server.proxy
        fault = proxy._choose(self.command)
        self.log_message('"%s" %s', self.requestline, fault or "forward")
        length = self._body_length()
        has_body = length is None or length > 0

        if fault == "slowdown":
            if self.expect_continue and has_body:
                # Refuse before the body is sent; the body never comes, so close.
                self.close_connection = True
            else:
                self._drain()
            self._send_slowdown()
            return
        if self.expect_continue and has_body:
            self.send_response_only(100)
            self.end_headers()
        if fault == "drop_request":
            if has_body:
                half = (length or CHUNK * 2) // 2
                for _ in self._body_chunks(limit=half):
                    pass
            self._abort()

        try:
            response = self._forward(length)
        except _ClientGone:
            self._close_upstream()
            raise
        except (OSError, http.client.HTTPException) as exc:
            self._close_upstream()
            proxy._count("upstream_errors")
            self._drain_rest()
            self._send_error(502, "BadGateway", f"upstream {proxy.upstream}: {exc}")
            return
        try:
            if fault == "drop_response":
                response.read()
                self._abort()
            self._relay(response, truncate=fault == "truncate")
        except BaseException:
            self._close_upstream()
            raise
        finally:
            response.close()
        if response.will_close:
            self._close_upstream()

    def _drain_rest(self) -> None:
        """After an upstream failure the rest of the request body is unread: close after."""
        self.close_connection = True

    def _close_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None

    def _upstream_conn(self) -> http.client.HTTPConnection:
        """The connection to the upstream: kept alive, replaced when the upstream closed it."""
        proxy = self.server.proxy
        up = self.upstream
        if up is not None and up.sock is not None:
            readable, _, _ = select.select([up.sock], [], [], 0)
            if readable:  # EOF (or junk) on an idle connection: it is dead
                self._close_upstream()
                up = None
        if up is None:
            up = http.client.HTTPConnection(
                proxy._up_host, proxy._up_port, timeout=proxy.upstream_timeout
            )
            self.upstream = up
        return up

    def _forward(self, length: int | None) -> http.client.HTTPResponse:
        up = self._upstream_conn()
        up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            if name.lower() not in HOP_BY_HOP:
                up.putheader(name, value)
        if length is None:
            up.putheader("Transfer-Encoding", "chunked")
        up.endheaders()
        for data in self._body_chunks():
            if length is None:
                up.send(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                up.send(data)
        if length is None:
            up.send(b"0\r\n\r\n")
        return up.getresponse()

    def _relay(self, response: http.client.HTTPResponse, truncate: bool) -> None:
        no_body = self.command == "HEAD" or response.status in (204, 304)
        length = response.getheader("Content-Length")
        chunked = not no_body and length is None
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        # Only a body of known length >= 2 bytes can be cut; otherwise answer faithfully.
        budget = int(length) // 2 if truncate and not no_body and length is not None else 0
        if truncate and budget < 1:
            truncate = False
            self.server.proxy._uncount("truncate")
        if not truncate:
            self.server.proxy._count("forwarded")
        if no_body:
            return
        sent = 0
        while True:
            data = response.read(min(CHUNK, budget - sent) if truncate else CHUNK)
            if not data:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            sent += len(data)
            if truncate and sent >= budget:
                self._abort()
        if chunked:
            self.wfile.write(b"0\r\n\r\n")

    def _send_slowdown(self) -> None:
        self._send_error(503, "SlowDown", "Please reduce your request rate.")

    def _send_error(self, status: int, code: str, message: str) -> None:
        request_id = uuid.uuid4().hex[:16]
        body = (
            SLOWDOWN_XML.replace("SlowDown", code)
            .replace("Please reduce your request rate.", message)
            .format(resource=self.path.split("?")[0], request_id=request_id)
            .encode()
        )
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amz-request-id", request_id)
        if status == 503:
            self.send_header("Retry-After", "0")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except _Dropped:
            self.close_connection = True
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def __getattr__(self, name: str):
        # do_GET, do_PUT, ...: every method goes through the proxy.
        if name.startswith("do_"):
            return self._proxy
        raise AttributeError(name)


class FaultProxy:
    """A reverse proxy on 127.0.0.1 in front of ``upstream`` that injects S3 faults.

    ``slowdown``, ``drop`` and ``truncate`` are shares of requests in [0, 1]
    (their sum at most 1); ``seed`` makes the sequence of decisions repeatable;
    ``methods`` limits faults to those HTTP methods (e.g. ``{"GET"}``). ``script``
    names, per method, the faults of its first requests in order (None: forwarded),
    e.g. ``{"POST": ["drop_response", None]}``; the shares apply after. The
    attributes may be changed while the proxy runs. ``stats`` counts requests
    and injected faults.
    """

    def __init__(
        self,
        upstream: str,
        *,
        slowdown: float = 0.0,
        drop: float = 0.0,
        truncate: float = 0.0,
        seed: int | None = None,
        port: int = 0,
        methods: Iterable[str] | None = None,
        upstream_timeout: float = 120.0,
        verbose: bool = False,
        script: dict[str, Iterable[str | None]] | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream = upstream
        self._up_host = parts.hostname
        self._up_port = parts.port or 80
        self.slowdown = slowdown
        self.drop = drop
        self.truncate = truncate
        self.methods = {m.upper() for m in methods} if methods is not None else None
        self._script = {m.upper(): deque(f) for m, f in (script or {}).items()}
        if bad := {f for q in self._script.values() for f in q} - {None, *FAULTS}:
            raise ValueError(f"unknown faults {sorted(bad)}: use {', '.join(FAULTS)}")
        self.upstream_timeout = upstream_timeout
        self.verbose = verbose
        self.stats = FaultStats()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> FaultProxy:
        """Listen on 127.0.0.1 (port 0: any free port) and serve in a daemon thread."""
        if self._server is not None:
            return self
        total = self.slowdown + self.drop + self.truncate
        if not 0 <= total <= 1:
            raise ValueError(f"slowdown + drop + truncate = {total}, must be within [0, 1]")
        self._server = _Server(("127.0.0.1", self._port), self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="s3fault",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, close every client connection, release the port."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FaultProxy is not running")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """The endpoint URL for clients, e.g. http://127.0.0.1:40123."""
        return f"http://127.0.0.1:{self.port}"

    # -- decisions and counters -------------------------------------------------------------
    def _choose(self, method: str) -> str | None:
        with self._lock:
            self.stats.requests += 1
            self.stats.by_method[method] = self.stats.by_method.get(method, 0) + 1
            r = self._rng.random()
            mode = self._rng.random()
            if self._script.get(method):
                scripted = self._script[method].popleft()
                if scripted is not None:
                    setattr(self.stats, scripted, getattr(self.stats, scripted) + 1)
                return scripted
            if self.methods is not None and method not in self.methods:
                return None
            fault: str | None = None
            if r < self.slowdown:
                fault = "slowdown"
            elif r < self.slowdown + self.drop:
                fault = "drop_request" if mode < 0.5 else "drop_response"
            elif r < self.slowdown + self.drop + self.truncate:
                fault = "truncate"
            if fault is not None:
                setattr(self.stats, fault, getattr(self.stats, fault) + 1)
            return fault

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)

    def _uncount(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) - 1)

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)


def main(argv: list[str] | None = None) -> int:
    """Run a proxy until SIGINT/SIGTERM or --duration; print the counters at exit."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.s3fault",
        description="Fault-injecting S3 reverse proxy on 127.0.0.1 (see docs/local-s3.md).",
    )
    parser.add_argument(
        "--upstream",
        default=os.environ.get("AWS_ENDPOINT_URL", "http://127.0.0.1:17480"),
        help="S3 endpoint to forward to [$AWS_ENDPOINT_URL or http://127.0.0.1:17480]",
    )
    parser.add_argument("--port", type=int, default=17481, help="listen port [17481]")
    parser.add_argument("--slowdown", type=float, default=0.0, help="share of 503 SlowDown")
    parser.add_argument("--drop", type=float, default=0.0, help="share of dropped connections")
    parser.add_argument("--truncate", type=float, default=0.0, help="share of cut responses")
    parser.add_argument("--seed", type=int, default=None, help="random seed")
    parser.add_argument("--methods", default=None, help="only these methods, e.g. GET,PUT")
    parser.add_argument("--duration", type=float, default=None, help="stop after N seconds")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    proxy = FaultProxy(
        args.upstream,
        slowdown=args.slowdown,
        drop=args.drop,
        truncate=args.truncate,
        seed=args.seed,
        port=args.port,
        methods=args.methods.split(",") if args.methods else None,
        verbose=args.verbose,
    )
    with proxy:
        print(f"export AWS_ENDPOINT_URL={proxy.url}", flush=True)
        print(f"[s3fault] {proxy.url} -> {args.upstream}", file=sys.stderr, flush=True)
        deadline = None if args.duration is None else time.monotonic() + args.duration
        while not stop.wait(0.2):
            if deadline is not None and time.monotonic() >= deadline:
                break
    print(f"[s3fault] {proxy.stats.as_dict()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
