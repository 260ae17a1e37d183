"""``s3/direct.py`` against a hand-made HTTP server that answers a GET with headers and a
part of the body, then stalls or hangs up: a cancelled GET writes nothing after it
returns (however long the read timeout), a cut or stalled one says how far it got, an
answer that is not what was asked for (another range, no length) is refused before a
byte is written, an error answer reads as botocore's, and TLS follows ``[s3] verify`` (a
self-signed certificate made with ``openssl``). Whole downloads through it are in
test_s3_ranged.py (moto) and tests/integration/test_s3.py (RGW, real signatures)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from bbstage.movers import TransferError
from bbstage.movers.implementations.s3 import direct
from bbstage.movers.implementations.s3.errors import translate
from bbstage.movers.implementations.s3.settings import S3Settings

SENT = 3 * direct.PIECE + 100  # body bytes the server sends before it stalls or hangs up


class _Fast:
    """What DirectGet asks of ``FastS3``."""

    def __init__(self, endpoint: str, verify: bool | str = True, read_timeout: float = 60) -> None:
        self.endpoint, self.region = endpoint, "us-east-1"
        self.settings = S3Settings(read_timeout=read_timeout, verify=verify)

    async def credentials(self) -> tuple[str, str, str | None]:
        return "key", "secret", None


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate for 127.0.0.1 (``cert.pem``, ``key.pem`` beside it)."""
    where = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(where / "key.pem"), "-out", str(where / "cert.pem")]
        + ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return where / "cert.pem"


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    """An endpoint whose GETs get ``SENT`` bytes of a 1 GiB body, then a stall (``stall``)
    or a closed connection (``cut``); or the whole body of ``SENT`` bytes, its head a byte
    at a time, then a stall (``whole``); or a 403 with S3's XML error (``denied``), a 404
    without a body (``missing``), a 403 in chunks (``denied-chunked``), no answer at all
    (``mute``), a chunked body (``chunked``), bytes 1.. of the object whatever was asked
    (``shifted``); over TLS with a ``tls-`` prefix."""
    how, tls = request.param, None
    if how.startswith("tls-"):  # the same, over TLS with the certificate of ``cert``
        how, cert = how[4:], request.getfixturevalue("cert")
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, cert.with_name("key.pem"))
    listener = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        if tls is not None:
            try:
                conn = tls.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError):  # a client that refused the certificate
                conn.close()
                return
        with conn:
            conn.recv(65536)
            if how == "mute":
                release.wait(30)
                return
            if how == "whole":
                head = f'HTTP/1.1 200 OK\r\nContent-Length: {SENT}\r\nETag: "e"\r\n\r\n'
                for byte in head.encode():
                    conn.sendall(bytes([byte]))
                    time.sleep(0.001)
                conn.sendall(b"x" * SENT)
                release.wait(30)
                return
            if how == "chunked":
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nxxxx\r\n")
                release.wait(30)
                return
            if how == "shifted":
                head = f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 1-{SENT}/{1 << 30}"
                conn.sendall(f'{head}\r\nContent-Length: {SENT}\r\nETag: "e"\r\n\r\n'.encode())
                conn.sendall(b"x" * SENT)
                release.wait(30)
                return
            if how == "denied-chunked":  # <Code> cut by a chunk boundary
                head = b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n"
                chunks = (
                    b"a\r\n<Error><Co\r\n33\r\nde>AccessDenied</Code><Message>no</Message></Error>"
                )
                conn.sendall(head + chunks + b"\r\n0\r\n\r\n")
                release.wait(30)
                return
            if how in ("denied", "missing"):  # the connection kept open, as a store does
                body = b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>"
                body = body if how == "denied" else b""
                status = "403 Forbidden" if how == "denied" else "404 Not Found"
                conn.sendall(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode())
                conn.sendall(body)
                release.wait(30)
                return
            head = f'HTTP/1.1 200 OK\r\nContent-Length: {1 << 30}\r\nETag: "e"\r\n\r\n'
            conn.sendall(head.encode() + b"x" * SENT)
            if how == "stall":
                release.wait(30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"{'https' if tls else 'http'}://127.0.0.1:{listener.getsockname()[1]}"
    release.set()
    thread.join(5)
    listener.close()


class _File:
    """The ``write`` callable: records what was written, and when."""

    def __init__(self) -> None:
        self.bytes, self.last = 0, 0.0

    def write(self, fd: int, view: memoryview, pos: int) -> None:
        assert pos == self.bytes
        self.bytes += len(view)
        self.last = time.monotonic()


def _get(
    endpoint: str,
    file: _File,
    reached: direct.Reached,
    seen: list[Any],
    verify: bool | str = True,
    end: int | None = None,
    read_timeout: float = 60.0,
) -> Any:
    class _Progress:
        def add(self, n: int) -> None:
            seen.append(n)

        def temp(self, path: str) -> None:
            pass

    return direct.DirectGet(_Fast(endpoint, verify, read_timeout)).get(  # type: ignore[arg-type]
        "bkt", "a key/ä+%?#.dat", -1, reached, end, seen.append, _Progress(), file.write
    )


@pytest.mark.parametrize("server", ["stall"], indirect=True)
def test_a_cancelled_get_writes_nothing_after_it_returns(server: str) -> None:
    file, reached, seen = _File(), direct.Reached(0), []

    async def main() -> float:
        task = asyncio.ensure_future(_get(server, file, reached, seen))
        while file.bytes < 3 * direct.PIECE:  # whole pieces: the last 100 bytes wait
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic()

    returned = asyncio.run(asyncio.wait_for(main(), 10))
    assert file.last < returned and reached.pos == file.bytes
    written = file.bytes  # the pieces, and maybe what the cut read returned: before the return
    time.sleep(0.2)
    assert file.bytes == written  # nothing written after the return


@pytest.mark.parametrize("server", ["mute"], indirect=True)
def test_a_get_cancelled_before_any_answer_returns_at_once(server: str) -> None:
    """Blocked waiting for the answer's headers (read timeout 60 s): cancelled, it returns
    at once."""
    file, reached = _File(), direct.Reached(0)

    async def main() -> float:
        task = asyncio.ensure_future(_get(server, file, reached, []))
        await asyncio.sleep(0.3)
        cancelled = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - cancelled

    assert asyncio.run(main()) < 2
    assert file.bytes == 0


@pytest.mark.parametrize("server", ["cut"], indirect=True)
def test_a_cut_get_is_transient_and_says_how_far_it_got(server: str) -> None:
    file, reached, seen = _File(), direct.Reached(0), []
    with pytest.raises(TransferError, match="short read at byte") as exc:
        asyncio.run(_get(server, file, reached, seen))
    assert not exc.value.permanent
    assert reached.pos == file.bytes == SENT
    assert seen[0] == {"ETag": '"e"', "ContentLength": 1 << 30}  # checked before any write
    assert sum(seen[1:]) == SENT  # progress


@pytest.mark.parametrize("server", ["stall"], indirect=True)
def test_a_stalled_get_times_out_and_says_how_far_it_got(server: str) -> None:
    """``[s3] read_timeout``: no byte for that long ends the GET (transient: resumed)."""
    file, reached = _File(), direct.Reached(0)
    t0 = time.monotonic()
    with pytest.raises(TransferError, match=r"failed \(TimeoutError\)") as exc:
        asyncio.run(_get(server, file, reached, [], read_timeout=0.5))
    assert 0.5 <= time.monotonic() - t0 < 5
    assert not exc.value.permanent and reached.pos == file.bytes == SENT


@pytest.mark.parametrize("server", ["whole"], indirect=True)
def test_a_whole_answer_ends_the_get_without_waiting_for_the_connection(server: str) -> None:
    """The body's last byte ends the GET (the store keeps the connection open); a head
    that arrives a byte at a time is read whole first."""
    file, reached, seen = _File(), direct.Reached(0), []
    asyncio.run(asyncio.wait_for(_get(server, file, reached, seen), 10))
    assert reached.pos == file.bytes == SENT
    assert seen[0] == {"ETag": '"e"', "ContentLength": SENT} and sum(seen[1:]) == SENT


@pytest.mark.parametrize(
    ("server", "end", "words", "permanent"),
    [
        (
            "shifted",
            SENT,
            r"answered bytes 1-\d+/\d+ \(\d+ bytes\) for a GET of \d+ bytes at 0",
            False,
        ),
        ("whole", SENT, "ignored the Range", True),
        ("chunked", None, "without Content-Length", False),  # its framing would be written
        ("tls-cut", None, "SSLCertVerificationError", False),  # the system's CAs: self-signed
    ],
    indirect=["server"],
)
def test_an_answer_not_as_asked_is_refused_before_any_write(
    server: str, end: int | None, words: str, permanent: bool
) -> None:
    """Bytes other than the range asked for, a ranged GET answered whole, a body without
    ``Content-Length``, a certificate the system's CAs do not trust."""
    file, reached = _File(), direct.Reached(0)
    with pytest.raises(TransferError, match=words) as exc:
        asyncio.run(_get(server, file, reached, [], end=end))
    assert exc.value.permanent == permanent and file.bytes == reached.pos == 0


@pytest.mark.parametrize(
    ("server", "code", "words"),
    [
        ("denied", "AccessDenied", "access denied: s3://bkt/k"),
        ("missing", "404", "no such object: s3://bkt/k"),
        ("denied-chunked", "AccessDenied", "access denied: s3://bkt/k"),
    ],
    indirect=["server"],
)
def test_an_error_answer_reads_as_botocores(server: str, code: str, words: str) -> None:
    """Read as soon as its body is whole (an empty one: at once; a chunked one: at its last
    chunk), the connection open; the code is the body's, if it has one."""
    file, reached = _File(), direct.Reached(0)
    with pytest.raises(ClientError) as exc:
        asyncio.run(asyncio.wait_for(_get(server, file, reached, []), 5))
    assert exc.value.response["Error"]["Code"] == code
    err = translate(exc.value, "s3://bkt/k", "bbuser1", server)
    assert err.permanent and words in str(err)
    assert file.bytes == 0


@pytest.mark.parametrize("server", ["tls-cut"], indirect=True)
def test_tls_with_the_sites_ca_bundle(server: str, cert: Path) -> None:
    """``[s3] verify``: a CA bundle's path trusts the store's certificate (as ``false``
    does, below); with the default (the system's CAs) a self-signed one is refused."""
    file, reached = _File(), direct.Reached(0)
    with pytest.raises(TransferError, match="short read"):  # connected, read, then cut
        asyncio.run(_get(server, file, reached, [], verify=str(cert)))
    assert file.bytes == SENT


@pytest.mark.parametrize("server", ["tls-cut"], indirect=True)
def test_tls_verify_false(server: str) -> None:
    file, reached = _File(), direct.Reached(0)
    with pytest.raises(TransferError, match="short read"):
        asyncio.run(_get(server, file, reached, [], verify=False))
    assert file.bytes == SENT


def test_a_proxy_for_the_endpoint_keeps_big_gets_on_botocore(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """http.client would not use a proxy: with one set for the endpoint, direct is not used
    (botocore, which uses it, is); ``no_proxy`` naming the endpoint's host lifts that."""
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert direct.DirectGet.available("http://10.0.0.1:7480")
    monkeypatch.setenv("http_proxy", "http://proxy:3128")
    assert not direct.DirectGet.available("http://10.0.0.1:7480")
    assert direct.DirectGet.available("https://10.0.0.1:7480")  # no https_proxy
    monkeypatch.setenv("no_proxy", "10.0.0.1")
    assert direct.DirectGet.available("http://10.0.0.1:7480")
