"""The fault-injecting S3 proxy (tests/s3fault.py) in front of real RGW (scripts/local-s3)."""

from __future__ import annotations

import hashlib
import http.client
import http.server
import json
import random
import socket
import subprocess
import sys
import threading
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    IncompleteReadError,
    ResponseStreamingError,
)

from tests.s3env import REPO, S3Env, s3  # noqa: F401
from tests.s3fault import FaultProxy

MiB = 1024 * 1024
READ_ERRORS = (IncompleteReadError, ResponseStreamingError, ConnectionClosedError)


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def read_with_retries(client: Any, bucket: str, key: str, attempts: int = 20) -> bytes:
    """GetObject and read the body; a body cut mid-stream is fetched again (botocore does
    not retry errors that happen after it returned the response)."""
    for attempt in range(attempts):
        try:
            return client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except READ_ERRORS:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def multipart_upload(client: Any, bucket: str, key: str, data: bytes, part: int) -> None:
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = []
    for number, offset in enumerate(range(0, len(data), part), start=1):
        etag = client.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload,
            PartNumber=number,
            Body=data[offset : offset + part],
        )["ETag"]
        parts.append({"ETag": etag, "PartNumber": number})
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )


def test_forwards_faithfully(s3: S3Env) -> None:  # noqa: F811
    """No faults: SigV4 (signed for the proxy's host:port) validates, every operation and
    error passes through unchanged, and the proxy counts each request as forwarded."""
    bucket = s3.create_bucket(owner="bbuser1")
    data = payload(1, 3 * MiB + 17)
    with FaultProxy(s3.endpoint) as proxy:
        client = s3.client("bbuser1", endpoint=proxy.url, retries=1)
        put = client.put_object(Bucket=bucket, Key="dir/a b+c", Body=data)
        head = client.head_object(Bucket=bucket, Key="dir/a b+c")
        assert head["ContentLength"] == len(data)
        assert head["ETag"] == put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
        assert client.get_object(Bucket=bucket, Key="dir/a b+c")["Body"].read() == data
        ranged = client.get_object(Bucket=bucket, Key="dir/a b+c", Range="bytes=100-199")
        assert ranged["Body"].read() == data[100:200]
        multipart_upload(client, bucket, "mp", data * 2, 5 * MiB)
        assert client.get_object(Bucket=bucket, Key="mp")["Body"].read() == data * 2
        listed = client.list_objects_v2(Bucket=bucket)
        assert [o["Key"] for o in listed["Contents"]] == ["dir/a b+c", "mp"]
        with pytest.raises(ClientError) as err:
            client.get_object(Bucket=bucket, Key="missing")
        assert err.value.response["Error"]["Code"] == "NoSuchKey"
        # Another user's keys are refused, through the proxy as directly.
        other = s3.client("bbuser2", endpoint=proxy.url, retries=1)
        with pytest.raises(ClientError) as err:
            other.get_object(Bucket=bucket, Key="mp")
        assert err.value.response["Error"]["Code"] == "AccessDenied"
        # The Host header is forwarded unchanged (not rewritten to the proxy's or the
        # upstream's address): a URL presigned for RGW's host:port works through the proxy.
        direct = s3.client("bbuser1", retries=1)
        url = direct.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": "mp"}, ExpiresIn=60
        )
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            path = url.split(s3.endpoint, 1)[1]
            host = s3.endpoint.split("//", 1)[1]
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert sock.recv(100).startswith(b"HTTP/1.1 200")
    stats = proxy.stats
    assert stats.faults == 0 and stats.upstream_errors == 0
    assert stats.forwarded == stats.requests >= 12


def test_faults_are_retried_and_bytes_match(s3: S3Env) -> None:  # noqa: F811
    """SlowDown, dropped connections and cut downloads: with retries every upload and
    download completes and the bytes in RGW (read directly) are the bytes sent."""
    bucket = s3.create_bucket(owner="bbuser1")
    objects = {f"obj/{i:02d}": payload(i, random.Random(i).randint(0, 2 * MiB)) for i in range(12)}
    big = payload(99, 12 * MiB + 5)
    with FaultProxy(s3.endpoint, slowdown=0.2, drop=0.15, truncate=0.1, seed=1) as proxy:
        client = s3.client("bbuser1", endpoint=proxy.url, retries=25, read_timeout=30)
        for key, data in objects.items():
            client.put_object(Bucket=bucket, Key=key, Body=data)
        multipart_upload(client, bucket, "big", big, 5 * MiB)
        for key, data in objects.items():
            assert read_with_retries(client, bucket, key) == data, key
        assert read_with_retries(client, bucket, "big") == big
    stats = proxy.stats
    assert stats.faults >= 8, stats
    for kind in ("slowdown", "drop_request", "drop_response", "truncate"):
        assert getattr(stats, kind) > 0, (kind, stats)
    assert stats.upstream_errors == 0
    # What RGW holds, read without the proxy.
    direct = s3.client("bbuser1")
    for key, data in [*objects.items(), ("big", big)]:
        assert direct.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key
    listed = direct.list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted(o["Key"] for o in listed) == sorted([*objects, "big"])


def test_slowdown_reaches_a_client_without_retries(s3: S3Env) -> None:  # noqa: F811
    bucket = s3.create_bucket()
    with FaultProxy(s3.endpoint, slowdown=1.0) as proxy:
        client = s3.client(endpoint=proxy.url, retries=1)
        with pytest.raises(ClientError) as err:
            client.put_object(Bucket=bucket, Key="k", Body=b"x" * (2 * MiB))
    assert err.value.response["Error"]["Code"] == "SlowDown"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert proxy.stats.slowdown == 1
    assert "Contents" not in s3.client().list_objects_v2(Bucket=bucket)


def test_dropped_response_after_the_upstream_executed(s3: S3Env) -> None:  # noqa: F811
    """drop_response: RGW stored the object, the client only sees a closed connection."""
    bucket = s3.create_bucket()
    with FaultProxy(s3.endpoint, drop=1.0, seed=3, methods={"PUT"}) as proxy:
        client = s3.client(endpoint=proxy.url, retries=1)
        for i in range(8):
            with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
                client.put_object(Bucket=bucket, Key=f"k{i}", Body=b"data")
        # GETs are not in `methods`: forwarded.
        client.list_objects_v2(Bucket=bucket)
    assert proxy.stats.drop_request + proxy.stats.drop_response == 8
    assert proxy.stats.drop_response > 0 and proxy.stats.drop_request > 0
    listed = s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    assert len(listed) == proxy.stats.drop_response


def test_loopback_only_and_stops(s3: S3Env) -> None:  # noqa: F811
    proxy = FaultProxy(s3.endpoint)
    with proxy:
        port = proxy.port
        assert proxy._server is not None
        assert proxy._server.server_address[0] == "127.0.0.1"
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    proxy.stop()  # idempotent
    with pytest.raises(ValueError):
        FaultProxy(s3.endpoint, slowdown=0.8, drop=0.5).start()


def test_command_line(s3: S3Env) -> None:  # noqa: F811
    """python -m tests.s3fault: prints the endpoint, stops after --duration, reports."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.s3fault", "--upstream", s3.endpoint, "--port", "0"]
        + ["--slowdown", "0.5", "--seed", "1", "--duration", "0.5"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("export AWS_ENDPOINT_URL=http://127.0.0.1:")
    assert "'faults': 0" in proc.stderr


class _Echo(http.server.BaseHTTPRequestHandler):
    """Upstream stand-in: answers with the request line, headers and body it received,
    in a chunked response."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_PUT(self) -> None:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            body = b""
            while size := int(self.rfile.readline().strip(), 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        echo = json.dumps(
            {"line": self.requestline, "headers": self.headers.items(), "body": body.hex()}
        ).encode()
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(0, len(echo), 1000):
            part = echo[i : i + 1000]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")


def test_chunked_bodies_and_exact_headers() -> None:
    """Without RGW: a chunked request body arrives whole, headers (case, order, duplicates,
    Host) unchanged, a chunked response comes back whole."""
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    try:
        with FaultProxy(f"http://127.0.0.1:{upstream.server_address[1]}") as proxy:
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
            body = payload(5, 700_000)
            conn.putrequest(
                "PUT", "/b/k%20x?partNumber=1&uploadId=u", skip_host=True, skip_accept_encoding=True
            )
            conn.putheader("Host", "s3.example:9000")
            conn.putheader("X-Amz-Meta-A", "1")
            conn.putheader("x-amz-meta-a", "2")
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            for i in range(0, len(body), 300_000):
                part = body[i : i + 300_000]
                conn.send(b"%x\r\n%s\r\n" % (len(part), part))
            conn.send(b"0\r\n\r\n")
            response = conn.getresponse()
            echo = json.loads(response.read())
            conn.close()
    finally:
        upstream.shutdown()
        upstream.server_close()
    assert response.status == 200
    assert echo["line"] == "PUT /b/k%20x?partNumber=1&uploadId=u HTTP/1.1"
    assert bytes.fromhex(echo["body"]) == body
    headers = [tuple(h) for h in echo["headers"]]
    assert headers[:3] == [
        ("Host", "s3.example:9000"),
        ("X-Amz-Meta-A", "1"),
        ("x-amz-meta-a", "2"),
    ]
    assert ("Transfer-Encoding", "chunked") in headers
    assert proxy.stats.forwarded == proxy.stats.requests == 1
