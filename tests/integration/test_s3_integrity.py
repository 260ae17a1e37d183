# ruff: noqa: F811 - the `s3` fixture is imported from tests.s3env and used as an argument
"""[K] I2 and I6 on real RGW (scripts/local-s3): results land (no skip on size alone,
``overwrite=newer`` by LastModified) and ``checksum=`` is stored, verified and refused when it
cannot be; the last test is the issue's own report, two sbatch jobs on the local cluster."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash

from bbstage.movers import MoverOptions, TransferError
from bbstage.movers.implementations import s3 as s3m
from bbstage.movers.implementations.s3.settings import S3Options
from bbstage.transfer import Planned, TransferSpec
from tests.helpers import Sink, corrupt_once, digest, run_worker, s3_sides
from tests.s3env import S3Env, s3  # noqa: F401

from .conftest import USER, Cluster, as_user

SMALL = {"part_size": "5M", "multipart_threshold": "8M", "max_concurrency": 4}


def extra(s3: S3Env, **conf: Any) -> dict[str, Any]:
    keys = s3.keys(USER)
    return {
        "s3": {"endpoint_url": s3.endpoint, **conf},
        "credentials": {"key": keys.key, "secret": keys.secret},
    }


def stage(s3: S3Env, src: str, dst: str, **fields: Any) -> Planned:
    """Run a transfer as a worker does, with bbuser1's keys; its Planned event."""
    conf = {k: fields.pop(k) for k in list(fields) if k in s3m.S3Settings.__struct_fields__}
    spec = TransferSpec.between(src, dst, job_id="it", **s3_sides(extra(s3, **conf)), **fields)
    return next(e for e in run_worker(spec).events if isinstance(e, Planned))


def body(s3: S3Env, bucket: str, key: str) -> bytes:
    return s3.client(USER).get_object(Bucket=bucket, Key=key)["Body"].read()


@pytest.mark.parametrize("tree", [False, True])
def test_same_size_changed_result_lands(s3: S3Env, tmp_path: Path, tree: bool) -> None:
    bucket = s3.create_bucket(owner=USER)
    f = tmp_path / "result.dat"
    first, second = os.urandom(64 << 10), os.urandom(64 << 10)
    f.write_bytes(first)
    s, d = (
        (f"{tmp_path}/", f"s3://{bucket}/o/") if tree else (str(f), f"s3://{bucket}/o/result.dat")
    )
    stage(s3, s, d)
    f.write_bytes(second)
    ns = f.stat().st_mtime_ns + 1_000_000_000  # a later job's file: a later mtime
    os.utime(f, ns=(ns, ns))
    assert stage(s3, s, d) == Planned(64 << 10, 1)
    assert digest(body(s3, bucket, "o/result.dat")) == digest(second)
    assert stage(s3, s, d) == Planned(0, 0)  # now current: a resumed transfer sends nothing


def test_overwrite_newer_and_never_per_direction(s3: S3Env, tmp_path: Path) -> None:
    bucket = s3.create_bucket(owner=USER)
    client = s3.client(USER)
    client.put_object(Bucket=bucket, Key="k", Body=b"object")
    src = tmp_path / "src"
    src.write_bytes(b"local file")
    url = f"s3://{bucket}/k"
    # Upload: the object's LastModified against the source's mtime.
    assert stage(s3, str(src), url, overwrite="never").files == 0
    os.utime(src, (time.time() - 3600,) * 2)
    assert stage(s3, str(src), url, overwrite="newer").files == 0
    assert body(s3, bucket, "k") == b"object"
    os.utime(src, (time.time() + 3600,) * 2)
    assert stage(s3, str(src), url, overwrite="newer").files == 1
    assert body(s3, bucket, "k") == b"local file"
    # Download: the local file's mtime against the object's.
    client.put_object(Bucket=bucket, Key="k", Body=b"object 2")
    dst = tmp_path / "dst"
    dst.write_bytes(b"local")
    assert stage(s3, url, str(dst), overwrite="never").files == 0
    os.utime(dst, (time.time() + 3600,) * 2)
    assert stage(s3, url, str(dst), overwrite="newer").files == 0
    assert dst.read_bytes() == b"local"
    os.utime(dst, (time.time() - 3600,) * 2)
    assert stage(s3, url, str(dst), overwrite="newer").files == 1
    assert dst.read_bytes() == b"object 2"


@pytest.mark.parametrize("size", [200_000, 20 << 20])  # one PUT; multipart
def test_checksum_both_directions(s3: S3Env, tmp_path: Path, size: int) -> None:
    bucket = s3.create_bucket(owner=USER)
    client = s3.client(USER)
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    stage(s3, str(tmp_path / "f"), f"s3://{bucket}/c", checksum="xxh3", **SMALL)
    meta = client.head_object(Bucket=bucket, Key="c")["Metadata"]
    assert meta["bbstage-xxh3"] == xxhash.xxh3_128(data).hexdigest()
    for concurrency in (1, 4):
        dst = tmp_path / f"d{concurrency}"
        url = f"s3://{bucket}/c"
        stage(s3, url, str(dst), checksum="xxh3", download_concurrency=concurrency, **SMALL)
        assert digest(dst.read_bytes()) == digest(data)
    # Corrupt it behind bbstage's back (same size, the old checksum kept): refused.
    bad = bytearray(data)
    bad[-1] ^= 1
    client.put_object(Bucket=bucket, Key="c", Body=bytes(bad), Metadata=meta)
    for concurrency in (1, 4):
        out = tmp_path / f"bad{concurrency}"
        out.mkdir()
        mover = s3m.S3Download(
            MoverOptions(
                checksum="xxh3",
                source=S3Options(**extra(s3, download_concurrency=concurrency, **SMALL)),
            )
        )
        tasks = mover.plan(f"s3://{bucket}/c", str(out / "c"), tree=False, glob=False)
        failed = mover.copy_many(tasks, Sink(), threading.Event(), lambda t: None)
        mover.close()
        assert "checksum mismatch (xxh3)" in str(next(iter(failed.values())))
        assert list(out.iterdir()) == []
    # An object with no bbstage checksum cannot be verified: a clear, permanent error.
    client.put_object(Bucket=bucket, Key="plain", Body=b"x")
    with pytest.raises(TransferError, match=rf"s3://{bucket}/plain has no bbstage blake2b") as e:
        stage(s3, f"s3://{bucket}/plain", str(tmp_path / "p"), checksum="blake2b")
    assert e.value.permanent and not (tmp_path / "p").exists()


@pytest.mark.parametrize(("size", "method"), [(100_000, "put_object"), (20 << 20, "upload_part")])
def test_rgw_refuses_a_body_that_does_not_match_its_content_md5(
    s3: S3Env, tmp_path: Path, size: int, method: str
) -> None:
    bucket = s3.create_bucket(owner=USER)
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    mover = s3m.S3Upload(MoverOptions(checksum="xxh3", source=S3Options(**extra(s3, **SMALL))))
    tasks = mover.plan(str(tmp_path / "f"), f"s3://{bucket}/c", tree=False, glob=False)
    calls = corrupt_once(mover, method)
    failed = mover.copy_many(tasks, Sink(), threading.Event(), lambda t: None)
    if method == "put_object":  # the worker retries the file
        [err] = failed.values()
        assert getattr(err, "code", "") == "BadDigest" and not err.permanent
        failed = mover.copy_many(tasks, Sink(), threading.Event(), lambda t: None)
    mover.close()
    assert failed == {} and len(calls) >= 2  # a part is retried inside the mover
    assert digest(body(s3, bucket, "c")) == digest(data)


@pytest.mark.cluster
def test_two_jobs_same_size_results_to_one_key(s3: S3Env, cluster: Cluster, workdir: Path) -> None:
    """The issue's report: two jobs stage out the same path to the same key (overwrite=always);
    the second file has the same length and other bytes. The object must hold the second."""
    bucket = s3.create_bucket(owner=USER)
    fast = workdir / "fast"
    fast.mkdir()
    as_user(workdir)
    key = "out/result.dat"

    def job(extra_opts: str) -> bytes:
        dst = f"s3://{bucket}/{key}"
        jid = cluster.submit(
            workdir,
            f"""#!/bin/bash
#BB_LUA stage_out source={fast}/result.dat destination={dst} overwrite=always {extra_opts}
head -c 65536 /dev/urandom > {fast}/result.dat
""",
        )
        cluster.wait_gone(jid, timeout=180)
        assert cluster.job(jid)["JobState"] == "COMPLETED"
        assert [d["state"] for d in cluster.status(jid)["directives"]] == ["done"]
        return (fast / "result.dat").read_bytes()

    first = job("")
    assert digest(body(s3, bucket, key)) == digest(first)
    second = job("checksum=xxh3")
    assert len(second) == len(first) and second != first
    assert digest(body(s3, bucket, key)) == digest(second)
    meta = s3.client(USER).head_object(Bucket=bucket, Key=key)["Metadata"]
    assert meta["bbstage-xxh3"] == xxhash.xxh3_128(second).hexdigest()
