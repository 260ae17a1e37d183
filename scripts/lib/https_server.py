"""A static HTTPS server for the tests (scripts/local-stores): serves DIRECTORY on HOST:PORT
with CERT/KEY (signed by the test CA), HTTP/1.1 with byte ranges (fsspec's HTTP reads
files in ranges). Usage: https_server.py HOST PORT DIRECTORY CERT KEY"""

from __future__ import annotations

import functools
import os
import re
import socket
import ssl
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer


class RangeHandler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def send_head(self):  # type: ignore[no-untyped-def]
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if not wanted or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        start = int(wanted.group(1))
        end = min(int(wanted.group(2)) if wanted.group(2) else size - 1, size - 1)
        if start >= size:
            self.send_error(416)
            return None
        f = open(path, "rb")  # noqa: SIM115 - closed by copyfile's caller
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self._left = end - start + 1
        return f

    def copyfile(self, source, outputfile):  # type: ignore[no-untyped-def]
        left = getattr(self, "_left", None)
        if left is None:
            return super().copyfile(source, outputfile)
        while left > 0:
            block = source.read(min(left, 1 << 20))
            if not block:
                break
            outputfile.write(block)
            left -= len(block)
        self._left = None

    def end_headers(self) -> None:
        if not self.headers.get("Range"):
            self.send_header("Accept-Ranges", "bytes")
        super().end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class TLSServer(ThreadingHTTPServer):
    """A thread per connection, as a real server serves many clients: the TLS handshake in
    the connection's thread (wrapping the listening socket would make the accepting thread
    do every handshake, one at a time), and a listen queue of 128 (socketserver's 5
    overflows when a client opens 8-16 connections at once: the SYNs dropped wait a second
    before they are sent again); no Nagle delay (as nginx's ``tcp_nodelay``: a response's
    body waited for the ACK of its headers, delayed by the client, ~9 ms a request)."""

    request_queue_size = 128
    daemon_threads = True
    context: ssl.SSLContext

    def finish_request(self, request, client_address):  # type: ignore[no-untyped-def]
        try:
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tls = self.context.wrap_socket(request, server_side=True)
        except OSError:  # ssl.SSLError too: a client that gave up, or spoke no TLS
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            tls.close()


def main() -> None:
    host, port, directory, cert, key = sys.argv[1:6]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    handler = functools.partial(RangeHandler, directory=directory)
    server = TLSServer((host, int(port)), handler)
    server.context = context
    server.serve_forever()


if __name__ == "__main__":
    main()
