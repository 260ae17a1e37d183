"""Big downloads in parallel ranged GETs (``download_concurrency`` > 1) against moto's server,
with ``tests/s3fault.py`` in front of it for cut and failed ranges: the parts land at their
offsets of one temporary file (bytes hashed), a cut range resumes where it stopped, a range
that keeps failing leaves nothing under the final name, and no attempt trusts another's
temporary file. Each through botocore's streamed ranges and through ``direct``'s (http.client
in a thread, straight into the file: s3/direct.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from bbstage.movers import TransferError
from bbstage.movers.implementations.s3 import direct, download, fast
from bbstage.transfer import TransferSpec
from tests.helpers import Conn, file_digest, run_worker, s3_sides
from tests.s3fault import FaultProxy

CREDS = {"key": "testing", "secret": "testing"}
SMALL = {"part_size": "5M", "multipart_threshold": "8M"}
SIZE = (23 << 20) + 12345  # four ranges of a quarter, or five of part_size (5 MiB)


def _new_bucket(endpoint: str) -> tuple[Any, str]:
    """A boto3 client of the moto server and a new bucket there."""
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    bucket = f"bkt-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    return client, bucket


@pytest.fixture(scope="module")
def big(endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A bucket holding ``big`` (``SIZE`` random bytes) and the local original."""
    client, bucket = _new_bucket(endpoint)
    src = tmp_path_factory.mktemp("ranged") / "big"
    src.write_bytes(os.urandom(SIZE))
    client.upload_file(str(src), bucket, "big")
    return bucket, src


def fetch(url: str, dst: Path, endpoint: str, **s3: Any) -> Conn:
    extra = {"s3": {"endpoint_url": endpoint, **SMALL, **s3}, "credentials": CREDS}
    return run_worker(TransferSpec.between(url, str(dst), job_id="r", **s3_sides(extra)))


@pytest.fixture(autouse=True, params=["botocore", "direct"])
def client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which client fetches the ranges (``direct`` comes with obstore's ``FastS3``)."""
    if request.param == "botocore":
        monkeypatch.setattr(
            fast.FastS3, "available", staticmethod(lambda settings, endpoint: False)
        )
    else:
        pytest.importorskip("obstore")
    return str(request.param)


@pytest.fixture
def ranges(monkeypatch: pytest.MonkeyPatch, client: str) -> list[tuple[int, int]]:
    """The (offset, count) of every range the download asked for."""
    asked: list[tuple[int, int]] = []
    real = download.S3Download._get_range

    async def spy(self: Any, task: Any, fd: int, offset: int, count: int, *a, **k):  # type: ignore[no-untyped-def]
        asked.append((offset, count))
        return await real(self, task, fd, offset, count, *a, **k)

    monkeypatch.setattr(download.S3Download, "_get_range", spy)
    return asked


def test_ranges_reassemble_into_the_object(
    tmp_path: Path, endpoint: str, big: tuple[str, Path], ranges: list[tuple[int, int]]
) -> None:
    bucket, src = big
    dst = tmp_path / "copy"
    fetch(f"s3://{bucket}/big", dst, endpoint, download_concurrency=4)
    step = -(-SIZE // 4)  # four equal ranges (each above part_size), the last one short
    assert sorted(ranges) == [(i * step, min(step, SIZE - i * step)) for i in range(4)]
    assert file_digest(dst) == file_digest(src)
    assert [p.name for p in tmp_path.iterdir()] == ["copy"]  # no temporary file left
    ranges.clear()  # more ways than part_size allows: ranges of part_size
    fetch(f"s3://{bucket}/big", tmp_path / "again", endpoint, download_concurrency=8)
    assert sorted(ranges) == [(i * (5 << 20), min(5 << 20, SIZE - i * (5 << 20))) for i in range(5)]
    assert file_digest(tmp_path / "again") == file_digest(src)


def test_cut_ranges_resume_and_reassemble(
    tmp_path: Path, endpoint: str, big: tuple[str, Path]
) -> None:
    bucket, src = big
    dst = tmp_path / "copy"
    with FaultProxy(endpoint, truncate=0.3, methods={"GET"}, seed=3) as proxy:
        fetch(f"s3://{bucket}/big", dst, proxy.url, download_concurrency=4)
    assert proxy.stats.truncate > 0
    assert file_digest(dst) == file_digest(src)


def test_a_range_that_keeps_failing_leaves_nothing_under_the_final_name(
    tmp_path: Path, endpoint: str, big: tuple[str, Path]
) -> None:
    bucket, src = big
    dst = tmp_path / "copy"
    dst.write_bytes(b"the old file")
    with FaultProxy(endpoint, truncate=1.0, methods={"GET"}) as proxy:
        with pytest.raises(TransferError, match=f"s3://{bucket}/big"):
            fetch(f"s3://{bucket}/big", dst, proxy.url, download_concurrency=4)
    assert proxy.stats.truncate > 0
    assert dst.read_bytes() == b"the old file"  # neither torn nor replaced
    assert [p.name for p in tmp_path.iterdir()] == ["copy"]  # the temporary file removed


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (a real file system that runs out of space)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_a_disk_too_small_fails_before_the_first_get(
    small_disk: Path, endpoint: str, big: tuple[str, Path], ranges: list[tuple[int, int]]
) -> None:
    """The file's space is taken before any range is fetched (``localfs.preallocate``): a
    disk too small says so at once, and nothing is left on it."""
    bucket, _ = big
    with pytest.raises(TransferError, match="no space left on device") as caught:
        fetch(f"s3://{bucket}/big", small_disk / "copy", endpoint, download_concurrency=4)
    assert caught.value.permanent
    assert ranges == []  # no GET made
    assert list(small_disk.iterdir()) == []


def test_a_new_attempt_does_not_trust_an_old_attempts_temporary_file(
    tmp_path: Path, endpoint: str, big: tuple[str, Path]
) -> None:
    """A killed worker's partial temp (full size, wrong bytes) stays what it is: the next
    attempt writes a fresh one, and the final file has the object's bytes."""
    bucket, src = big
    dst = tmp_path / "copy"
    stale = tmp_path / ".copy.bbstage-r-0123abcd.part"
    stale.write_bytes(b"\0" * SIZE)
    fetch(f"s3://{bucket}/big", dst, endpoint, download_concurrency=4)
    assert file_digest(dst) == file_digest(src)
    assert stale.read_bytes() == b"\0" * SIZE


@pytest.mark.parametrize("client", ["obstore"], indirect=True)  # botocore's: test_s3_mover
def test_ranges_of_a_replaced_object_are_refused(
    tmp_path: Path,
    endpoint: str,
    big: tuple[str, Path],
    client: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ranges that come from two versions of the object (another ETag) never make a file."""

    def another(resp: dict[str, Any], start: int) -> dict[str, Any]:
        return {**resp, "ETag": '"another"'} if start != 0 else resp

    real_get, real_direct = download.S3Download._get, direct.DirectGet.get

    @contextlib.asynccontextmanager
    async def get(self: Any, task: Any, start: int, end: int | None) -> Any:
        async with real_get(self, task, start, end) as (resp, chunks):
            yield another(resp, start), chunks

    async def direct_get(
        self: Any, bucket: str, key: str, fd: int, reached: Any, end: Any, check: Any, *a: Any
    ) -> None:  # type: ignore[no-untyped-def]
        start = reached.pos
        await real_direct(
            self, bucket, key, fd, reached, end, lambda r: check(another(r, start)), *a
        )

    monkeypatch.setattr(download.S3Download, "_get", get)
    monkeypatch.setattr(direct.DirectGet, "get", direct_get)
    bucket, _ = big
    dst = tmp_path / "copy"
    with pytest.raises(TransferError, match="changed while staging"):
        fetch(f"s3://{bucket}/big", dst, endpoint, download_concurrency=4)
    assert list(tmp_path.iterdir()) == []


def test_a_cut_stream_resumes_where_it_stopped(
    tmp_path: Path, endpoint: str, big: tuple[str, Path], ranges: list[tuple[int, int]]
) -> None:
    """One streamed GET (``download_concurrency = 1``) that the network cuts goes on with a
    ranged GET from the byte it reached: the file is whole and nothing is fetched twice."""
    bucket, src = big
    dst = tmp_path / "copy"
    with FaultProxy(endpoint, truncate=0.5, methods={"GET"}, seed=3) as proxy:
        fetch(f"s3://{bucket}/big", dst, proxy.url, download_concurrency=1, retries=1)
    assert proxy.stats.truncate > 0
    assert ranges == [(0, SIZE)]  # one stream, resumed inside it
    assert file_digest(dst) == file_digest(src)


def test_the_file_is_written_in_pieces_of_at_most_write_bytes(
    tmp_path: Path,
    endpoint: str,
    big: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    client: str,
) -> None:
    """Streamed chunks (botocore's: 1 MiB) and ranges reach the file in writes of at most
    ``download._WRITE`` bytes (bigger ones cost ~5x the CPU on ext4: docs/performance.md;
    ``direct`` reads and writes ``direct.PIECE``), and the pieces make up the object."""
    bucket, src = big
    sizes: list[int] = []
    real = os.pwrite

    def spy(fd: int, data: Any, offset: int) -> int:
        sizes.append(len(data))
        return real(fd, data, offset)

    monkeypatch.setattr(download.os, "pwrite", spy)
    for parts in (1, 4):
        dst = tmp_path / f"copy{parts}"
        fetch(f"s3://{bucket}/big", dst, endpoint, download_concurrency=parts)
        assert file_digest(dst) == file_digest(src)
    assert sum(sizes) == 2 * SIZE
    assert max(sizes) == (download._WRITE if client == "botocore" else direct.PIECE)


@pytest.mark.parametrize("client", ["obstore"], indirect=True)  # direct's connections
def test_gets_at_once_stay_within_max_pool_connections(
    tmp_path: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every GET straight into a file is a connection: however many objects are in
    flight, and ranges each, at most ``max_pool_connections`` are open at once."""
    import asyncio

    monkeypatch.setattr(download, "FAST_MAX", 10_000)  # these objects: one direct GET each
    busy, peak = [0], [0]
    real = direct._connect

    async def spy(*a: Any) -> Any:
        busy[0] += 1
        peak[0] = max(peak[0], busy[0])
        await asyncio.sleep(0.05)  # long enough for the others to start, if they may
        transport = await real(*a)
        real_abort = transport.abort

        def abort() -> None:  # how every GET's connection ends
            busy[0] -= 1
            real_abort()

        transport.abort = abort
        return transport

    monkeypatch.setattr(direct, "_connect", spy)
    client, bucket = _new_bucket(endpoint)
    bodies = {f"o{i}": os.urandom(50_000) for i in range(12)}
    for key, body in bodies.items():
        client.put_object(Bucket=bucket, Key=f"t/{key}", Body=body)
    dst = tmp_path / "t"
    fetch(f"s3://{bucket}/t/", dst, endpoint, files_in_flight=12, max_pool_connections=3)
    assert peak[0] == 3
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == bodies
