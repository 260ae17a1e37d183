"""A static HTTPS server for the tests (scripts/local-stores): serves DIRECTORY on HOST:PORT
with CERT/KEY (signed by the test CA), HTTP/1.1 with byte ranges (fsspec's HTTP reads
files in ranges). Usage: https_server.py HOST PORT DIRECTORY CERT KEY"""

from __future__ import annotations

import functools
import os
import re
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


def main() -> None:
    host, port, directory, cert, key = sys.argv[1:6]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    handler = functools.partial(RangeHandler, directory=directory)
    server = ThreadingHTTPServer((host, int(port)), handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
