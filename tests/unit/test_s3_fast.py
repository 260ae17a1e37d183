"""Small objects through obstore (s3/fast.py) against moto's server: they do go that way, carry
the same metadata as botocore's PUTs (so a re-run skips them), survive throttling and cut
connections (tests/s3fault.py), and ``checksum=`` keeps them on botocore (Content-MD5, ETag)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bbstage.movers.implementations.s3 import MTIME_KEY, fast
from bbstage.transfer import Planned, TransferSpec
from tests.helpers import Conn, make_tree, run_worker, s3_sides, tree_digests
from tests.s3fault import FaultProxy

pytest.importorskip("obstore")
CREDS = {"key": "testing", "secret": "testing"}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many GETs and PUTs went through obstore."""
    counted = {"get": 0, "put": 0}
    for name in counted:
        real = getattr(fast.FastS3, name)

        def spy(self: Any, *args: Any, _real: Any = real, _name: str = name) -> Any:
            counted[_name] += 1
            return _real(self, *args)

        monkeypatch.setattr(fast.FastS3, name, spy)
    return counted


def stage(src: str, dst: str, endpoint: str, checksum: str = "none") -> Conn:
    extra = {"s3": {"endpoint_url": endpoint}, "credentials": CREDS}
    spec = TransferSpec.between(src, dst, job_id="f", checksum=checksum, **s3_sides(extra))
    return run_worker(spec)


def test_small_objects_go_through_obstore_with_bbstage_metadata(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, calls: dict[str, int]
) -> None:
    src = make_tree(tmp_path / "src", 30, 5000, sub="sub")
    stage(f"{src}/", f"s3://{bucket}/t/", endpoint)
    assert calls == {"get": 0, "put": 30}
    some = sorted(p for p in src.rglob("*") if p.is_file())[0]
    head = client.head_object(Bucket=bucket, Key=f"t/{some.relative_to(src)}")
    assert head["Metadata"][MTIME_KEY] == str(some.stat().st_mtime_ns)
    dst = tmp_path / "dst"
    stage(f"s3://{bucket}/t/", f"{dst}/", endpoint)
    assert calls == {"get": 30, "put": 30}
    assert tree_digests(dst) == tree_digests(src)
    # The metadata makes a re-run skip every object, both ways.
    assert Planned(0, 0) in stage(f"{src}/", f"s3://{bucket}/t/", endpoint).events
    assert Planned(0, 0) in stage(f"s3://{bucket}/t/", f"{dst}/", endpoint).events


def test_throttled_dropped_and_cut_requests_are_retried(
    tmp_path: Path, endpoint: str, bucket: str, calls: dict[str, int]
) -> None:
    src = make_tree(tmp_path / "src", 40, 20000)
    dst = tmp_path / "dst"
    with FaultProxy(endpoint, slowdown=0.1, drop=0.1, truncate=0.1, seed=5) as proxy:
        stage(f"{src}/", f"s3://{bucket}/t/", proxy.url)
        stage(f"s3://{bucket}/t/", f"{dst}/", proxy.url)
    assert proxy.stats.faults > 0 and calls["get"] >= 40 and calls["put"] >= 40
    assert tree_digests(dst) == tree_digests(src)


def test_checksum_keeps_small_objects_on_botocore(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, calls: dict[str, int]
) -> None:
    src = tmp_path / "f"
    src.write_bytes(os.urandom(10000))
    stage(str(src), f"s3://{bucket}/f", endpoint, checksum="xxh3")
    stage(f"s3://{bucket}/f", str(tmp_path / "g"), endpoint, checksum="xxh3")
    assert calls == {"get": 0, "put": 0}
    assert (tmp_path / "g").read_bytes() == src.read_bytes()


@pytest.mark.parametrize(
    ("endpoint", "style", "used"),
    [
        ("http://127.0.0.1:7480", None, True),
        ("https://s3.example.org", "path", True),
        ("https://s3.example.org", "virtual", False),
        ("https://s3.us-east-1.amazonaws.com", None, False),
        ("https://s3.amazonaws.com", "path", False),
    ],
)
def test_obstore_only_for_a_sites_own_endpoint_with_path_addressing(
    endpoint: str, style: str | None, used: bool
) -> None:
    from bbstage.movers.implementations.s3 import S3Settings

    settings = S3Settings.from_config({"addressing_style": style} if style else {})
    assert fast.FastS3.available(settings, endpoint) is used


@pytest.mark.parametrize(
    ("text", "permanent", "code"),
    [
        (
            "Generic S3 error: Error performing GET http://127.0.0.1:39717/b/k in 1ms - Server"
            " returned non-2xx status code: 400 Bad Request: <Error/>",
            True,
            "400",
        ),
        (
            "Generic S3 error: Error performing GET http://10.0.0.1:7480/b/k in 9ms, after 2"
            " retries - Server returned non-2xx status code: 503 Service Unavailable",
            False,
            "503",
        ),
        ("Generic S3 error: Client error with status 416 Range Not Satisfiable", True, "416"),
        ("Generic S3 error: connection reset by 127.0.0.1:7480", False, ""),
    ],
)
def test_obstore_errors_are_read_by_their_http_status_not_the_address(
    text: str, permanent: bool, code: str
) -> None:
    """The status is the one obstore names: the "127" of the endpoint's address is none."""
    from bbstage.movers.implementations.s3.fast import ObstoreError, translate_obstore

    err = translate_obstore(ObstoreError(Exception(text)), "s3://b/k", "who", "http://x")
    assert (err.permanent, getattr(err, "code", None)) == (permanent, code)


@pytest.mark.parametrize(
    ("endpoint", "verify", "verified"),
    [
        ("http://127.0.0.1:7480", True, False),  # no TLS: no roots loaded (each store read
        # every file of /etc/ssl/certs, 50 ms with a cold page cache)
        ("https://s3.example.org", True, True),
        ("https://s3.example.org", False, False),
    ],
)
def test_certificates_are_verified_and_loaded_only_for_tls(
    monkeypatch: pytest.MonkeyPatch, endpoint: str, verify: bool, verified: bool
) -> None:
    import asyncio
    from types import SimpleNamespace

    import obstore.store

    from bbstage.movers.implementations.s3 import S3Settings

    built: list[dict[str, Any]] = []
    monkeypatch.setattr(
        obstore.store, "S3Store", lambda *a, client_options, **k: built.append(client_options)
    )
    client = SimpleNamespace(meta=SimpleNamespace(endpoint_url=endpoint, region_name="r"))
    store = fast.FastS3(client, None, CREDS, S3Settings(verify=verify))
    asyncio.run(store.store("b"))
    assert built[0].get("allow_invalid_certificates", False) is not verified
