"""The store's ceiling for a big download: a client that reads every byte of an object and
writes none, as bbstage asks for it (``download_concurrency`` equal ranged GETs at once, read
by one thread into a 128 KiB buffer each). No client that has to put the bytes into a file
can be faster, so "a peer's time ÷ this one's" bounds any client's lead over that peer.
"""

from __future__ import annotations

import re
import selectors
import socket
import urllib.parse

from bbstage.movers.implementations.s3.direct import PIECE  # bbstage's read size

_LENGTH = re.compile(rb"(?im)^content-length:\s*(\d+)\s*$")


def read_ranges(presigned_url: str, size: int, ranges: int) -> int:
    """GET ``size`` bytes of the object at ``presigned_url`` in ``ranges`` equal ranges at
    once, throwing the bytes away; the number of body bytes read (== ``size``, else raises)."""
    url = urllib.parse.urlsplit(presigned_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    step = size // ranges
    sel = selectors.DefaultSelector()
    buf = memoryview(bytearray(PIECE))
    left: dict[socket.socket, int] = {}  # body bytes still to come, per open range
    total = 0
    try:
        for i in range(ranges):
            first, last = i * step, (size if i == ranges - 1 else (i + 1) * step) - 1
            sock = socket.create_connection((host, port))
            left[sock] = last - first + 1
            sock.sendall(
                f"GET {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                f"Range: bytes={first}-{last}\r\n\r\n".encode()
            )
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ, bytearray())  # the head, until parsed
        while left:
            for key, _ in sel.select():
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                n = sock.recv_into(buf)
                if n == 0:
                    raise ConnectionError("the store closed a range's connection early")
                head = key.data
                if head is not None:  # still reading the status line and headers
                    head += buf[:n]
                    if b"\r\n\r\n" not in head:
                        continue
                    status, _, body = bytes(head).partition(b"\r\n\r\n")
                    if b" 206 " not in status.split(b"\r\n", 1)[0]:
                        raise ConnectionError(f"not a partial answer: {status[:200]!r}")
                    length = _LENGTH.search(status)
                    if length is None or int(length[1]) != left[sock]:
                        raise ConnectionError(f"not the range asked for: {status[:400]!r}")
                    sel.modify(sock, selectors.EVENT_READ, None)
                    n = len(body)
                left[sock] -= n
                total += n
                if left[sock] <= 0:
                    sel.unregister(sock)
                    sock.close()
                    del left[sock]
    finally:
        for sock in left:
            sock.close()
        sel.close()
    if total != size:
        raise ConnectionError(f"read {total} bytes of {size}")
    return total
