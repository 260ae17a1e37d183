"""S3 results land and asked-for checksums are verified (issue [K], I2 and I6), against moto.

Every test here failed on the code before the fix (size-only skip, ``checksum=`` ignored on
S3, ``overwrite=newer`` always overwriting). Real RGW: tests/integration/test_s3_integrity.py.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash

from bbstage.movers import FileTask, MoverOptions, TransferError
from bbstage.movers import checksum as cs
from bbstage.movers.implementations import s3 as s3m
from bbstage.movers.implementations.s3.settings import S3Options
from bbstage.transfer import Planned, TransferSpec
from tests.helpers import Sink, corrupt_once, run_worker, s3_sides

from .test_s3_mover import extra

SMALL = {"part_size": "5M", "multipart_threshold": "8M", "max_concurrency": 4}


def run(src: str, dst: str, endpoint: str, **fields: Any) -> Planned:
    """Stage as a worker does (plan, select, copy with retries); the Planned event."""
    s3 = {k: fields.pop(k) for k in list(fields) if k in s3m.S3Settings.__struct_fields__}
    spec = TransferSpec.between(src, dst, job_id="7", **s3_sides(extra(endpoint, **s3)), **fields)
    return next(e for e in run_worker(spec).events if isinstance(e, Planned))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def body(client: Any, bucket: str, key: str) -> bytes:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def rewrite(path: Path, data: bytes, mtime: float | None = None) -> None:
    """New bytes of the same length, with a later (or the given) mtime."""
    before = path.stat().st_mtime_ns
    path.write_bytes(data)
    ns = int(mtime * 1e9) if mtime is not None else before + 1_000_000_000
    os.utime(path, ns=(ns, ns))


# -- I2: results land -------------------------------------------------------------------------


@pytest.mark.parametrize("tree", [False, True])
def test_same_size_changed_file_lands_with_overwrite_always(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, tree: bool
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    first, second = os.urandom(4096), os.urandom(4096)
    (src / "result.dat").write_bytes(first)
    s, d = (
        (f"{src}/", f"s3://{bucket}/out/")
        if tree
        else (f"{src}/result.dat", f"s3://{bucket}/out/result.dat")
    )
    run(s, d, endpoint)
    assert sha(body(client, bucket, "out/result.dat")) == sha(first)
    rewrite(src / "result.dat", second)  # the second job's result: same size, other bytes
    assert run(s, d, endpoint) == Planned(4096, 1)
    assert sha(body(client, bucket, "out/result.dat")) == sha(second)
    # Now it is current: a resumed transfer sends nothing.
    assert run(s, d, endpoint) == Planned(0, 0)


@pytest.mark.parametrize("tree", [False, True])
def test_an_object_of_the_same_size_not_written_by_us_is_not_current(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, tree: bool
) -> None:
    (tmp_path / "f").write_bytes(b"mine")
    client.put_object(Bucket=bucket, Key="p/f", Body=b"them")  # no bbstage mtime metadata
    s, d = (
        (f"{tmp_path}/", f"s3://{bucket}/p/")
        if tree
        else (str(tmp_path / "f"), f"s3://{bucket}/p/f")
    )
    assert run(s, d, endpoint).files == 1
    assert body(client, bucket, "p/f") == b"mine"


def test_every_upload_records_the_source_mtime(
    tmp_path: Path, endpoint: str, client: Any, bucket: str
) -> None:
    (tmp_path / "small").write_bytes(b"x" * 10)
    (tmp_path / "big").write_bytes(os.urandom(9 << 20))
    run(f"{tmp_path}/", f"s3://{bucket}/m/", endpoint, **SMALL)
    for name in ("small", "big"):
        meta = client.head_object(Bucket=bucket, Key=f"m/{name}")["Metadata"]
        assert meta[s3m.MTIME_KEY] == str((tmp_path / name).stat().st_mtime_ns)


@pytest.mark.parametrize("tree", [False, True])
def test_overwrite_newer_on_upload_compares_the_objects_last_modified(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, tree: bool
) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"old source")
    client.put_object(Bucket=bucket, Key="n/f", Body=b"object")
    s, d = (f"{tmp_path}/", f"s3://{bucket}/n/") if tree else (str(f), f"s3://{bucket}/n/f")
    os.utime(f, (time.time() - 3600, time.time() - 3600))  # older than the object: kept
    assert run(s, d, endpoint, overwrite="newer") == Planned(0, 0)
    assert body(client, bucket, "n/f") == b"object"
    os.utime(f, (time.time() + 3600, time.time() + 3600))  # newer than the object: sent
    assert run(s, d, endpoint, overwrite="newer").files == 1
    assert body(client, bucket, "n/f") == b"old source"


def test_overwrite_never_keeps_an_existing_object(
    tmp_path: Path, endpoint: str, client: Any, bucket: str
) -> None:
    (tmp_path / "f").write_bytes(b"new")
    client.put_object(Bucket=bucket, Key="k", Body=b"kept")
    assert run(str(tmp_path / "f"), f"s3://{bucket}/k", endpoint, overwrite="never").files == 0
    assert body(client, bucket, "k") == b"kept"
    assert run(str(tmp_path / "f"), f"s3://{bucket}/new", endpoint, overwrite="never").files == 1


def test_download_newer_and_never_compare_the_local_file(
    tmp_path: Path, endpoint: str, client: Any, bucket: str
) -> None:
    client.put_object(Bucket=bucket, Key="k", Body=b"object")
    dst = tmp_path / "k"
    dst.write_bytes(b"local")
    url = f"s3://{bucket}/k"
    assert run(url, str(dst), endpoint, overwrite="never").files == 0
    os.utime(dst, (time.time() + 3600, time.time() + 3600))
    assert run(url, str(dst), endpoint, overwrite="newer").files == 0
    assert dst.read_bytes() == b"local"
    os.utime(dst, (time.time() - 3600, time.time() - 3600))
    assert run(url, str(dst), endpoint, overwrite="newer").files == 1
    assert dst.read_bytes() == b"object"


# -- I6: asked-for checksums are verified ------------------------------------------------------


def digest(algorithm: str, data: bytes) -> str:
    h = cs.new(algorithm)
    h.update(data)
    return h.hexdigest()


@pytest.mark.parametrize("algorithm", ["xxh3", "blake2b"])
@pytest.mark.parametrize("size", [100_000, 20 << 20])  # one PUT; multipart (4 parts)
def test_checksum_stored_on_upload_and_verified_on_download(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, algorithm: str, size: int
) -> None:
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    run(str(tmp_path / "f"), f"s3://{bucket}/c", endpoint, checksum=algorithm, **SMALL)
    meta = client.head_object(Bucket=bucket, Key="c")["Metadata"]
    assert meta[s3m.checksum_key(algorithm)] == digest(algorithm, data)
    for concurrency in (1, 4):
        dst = tmp_path / f"d{concurrency}"
        run(
            f"s3://{bucket}/c",
            str(dst),
            endpoint,
            checksum=algorithm,
            download_concurrency=concurrency,
            **SMALL,
        )
        assert sha(dst.read_bytes()) == sha(data)


def test_download_with_checksum_refuses_an_object_without_one(
    tmp_path: Path, endpoint: str, client: Any, bucket: str
) -> None:
    client.put_object(Bucket=bucket, Key="plain", Body=b"no checksum here")
    with pytest.raises(TransferError) as e:
        run(f"s3://{bucket}/plain", str(tmp_path / "p"), endpoint, checksum="xxh3")
    text = str(e.value)
    assert f"s3://{bucket}/plain" in text and "x-amz-meta-bbstage-xxh3" in text
    assert "drop checksum=" in text and e.value.permanent
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("size", [1000, 20 << 20])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_download_with_checksum_refuses_a_corrupted_object(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, size: int, concurrency: int
) -> None:
    good = os.urandom(size)
    (tmp_path / "f").write_bytes(good)
    run(str(tmp_path / "f"), f"s3://{bucket}/c", endpoint, checksum="xxh3", **SMALL)
    meta = client.head_object(Bucket=bucket, Key="c")["Metadata"]
    bad = bytearray(good)
    bad[size // 2] ^= 0xFF  # one flipped byte, same size, the original checksum kept
    client.put_object(Bucket=bucket, Key="c", Body=bytes(bad), Metadata=meta)
    out = tmp_path / "out"
    out.mkdir()
    mover = s3m.S3Download(
        MoverOptions(
            checksum="xxh3",
            source=S3Options(**extra(endpoint, download_concurrency=concurrency, **SMALL)),
        )
    )
    tasks = mover.plan(f"s3://{bucket}/c", str(out / "c"), tree=False, glob=False)
    failed = mover.copy_many(tasks, Sink(), threading.Event(), lambda t: None)
    mover.close()
    [err] = failed.values()
    assert f"checksum mismatch (xxh3): s3://{bucket}/c" in str(err) and not err.permanent
    assert list(out.iterdir()) == []  # nothing put in place, no temporary left


def test_checksum_none_downloads_objects_without_metadata(
    tmp_path: Path, endpoint: str, client: Any, bucket: str
) -> None:
    client.put_object(Bucket=bucket, Key="plain", Body=b"fine")
    run(f"s3://{bucket}/plain", str(tmp_path / "p"), endpoint)
    assert (tmp_path / "p").read_bytes() == b"fine"


@pytest.mark.parametrize(("size", "method"), [(1000, "put_object"), (20 << 20, "upload_part")])
def test_upload_with_checksum_finds_bytes_that_landed_wrong(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, size: int, method: str
) -> None:
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    mover = s3m.S3Upload(
        MoverOptions(checksum="xxh3", source=S3Options(**extra(endpoint, **SMALL)))
    )
    tasks = mover.plan(str(tmp_path / "f"), f"s3://{bucket}/c", tree=False, glob=False)
    corrupt_once(mover, method)  # moto ignores Content-MD5: only the ETag check catches it
    failed = mover.copy_many(tasks, Sink(), threading.Event(), lambda t: None)
    [err] = failed.values()
    assert "what landed is not what was sent" in str(err) and not err.permanent
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # deleted
    assert mover.copy_many(tasks, Sink(), threading.Event(), lambda t: None) == {}  # the retry
    mover.close()
    assert sha(body(client, bucket, "c")) == sha(data)


def test_multipart_with_checksum_refuses_a_file_that_changed_while_read(
    tmp_path: Path,
    endpoint: str,
    client: Any,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "f").write_bytes(os.urandom(20 << 20))
    # The digest taken before the upload differs from the bytes then read: as if the file
    # had been rewritten in between.
    monkeypatch.setattr(cs, "digest_fd", lambda algorithm, fd: "0" * 32)
    mover = s3m.S3Upload(
        MoverOptions(checksum="xxh3", source=S3Options(**extra(endpoint, **SMALL)))
    )
    tasks = mover.plan(str(tmp_path / "f"), f"s3://{bucket}/c", tree=False, glob=False)
    failed = mover.copy_many(tasks, Sink(), threading.Event(), lambda t: None)
    mover.close()
    [err] = failed.values()
    assert "changed while staging" in str(err) and not err.permanent
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_with_checksum_an_object_without_our_digest_is_not_current(
    tmp_path: Path, endpoint: str, client: Any, bucket: str
) -> None:
    data = os.urandom(1000)
    (tmp_path / "f").write_bytes(data)
    run(str(tmp_path / "f"), f"s3://{bucket}/c", endpoint)  # no checksum= the first time
    assert run(str(tmp_path / "f"), f"s3://{bucket}/c", endpoint, checksum="xxh3").files == 1
    meta = client.head_object(Bucket=bucket, Key="c")["Metadata"]
    assert meta["bbstage-xxh3"] == xxhash.xxh3_128(data).hexdigest()
    assert run(str(tmp_path / "f"), f"s3://{bucket}/c", endpoint, checksum="xxh3").files == 0


def test_resumed_tree_upload_heads_only_objects_of_matching_size(
    tmp_path: Path, endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(20):
        (tmp_path / f"f{i}").write_bytes(os.urandom(100 + i))
    run(f"{tmp_path}/", f"s3://{bucket}/t/", endpoint)
    (tmp_path / "f0").write_bytes(b"shorter")  # size differs: no HEAD needed
    heads: list[str] = []
    real = s3m.S3Upload._head_remote

    async def counted(self: s3m.S3Upload, b: str, key: str) -> Any:
        heads.append(key)
        return await real(self, b, key)

    monkeypatch.setattr(s3m.S3Upload, "_head_remote", counted)
    assert run(f"{tmp_path}/", f"s3://{bucket}/t/", endpoint) == Planned(7, 1)
    assert sorted(heads) == sorted(f"t/f{i}" for i in range(1, 20))
    heads.clear()
    run(f"{tmp_path}/", f"s3://{bucket}/fresh/", endpoint)  # nothing there: no HEAD at all
    assert heads == []


def test_unknown_checksum_is_refused() -> None:
    with pytest.raises(TransferError, match="unknown checksum 'md5'"):
        s3m.S3Upload(MoverOptions(checksum="md5", source=S3Options(**extra("http://unused"))))


def test_current_is_never_true_on_size_alone(
    tmp_path: Path, endpoint: str, client: Any, bucket: str
) -> None:
    (tmp_path / "f").write_bytes(b"abcd")
    client.put_object(Bucket=bucket, Key="k", Body=b"wxyz")
    mover = s3m.S3Upload(MoverOptions(source=S3Options(**extra(endpoint))))
    [task] = mover.plan(str(tmp_path / "f"), f"s3://{bucket}/k", tree=False, glob=False)
    assert mover.current(task) is False
    assert mover.current(FileTask(task.src, f"s3://{bucket}/absent", size=4)) is None
    mover.close()
