# ruff: noqa: F811 - the `s3` fixture is imported from tests.s3env and used as an argument
"""[E] The S3 movers against real RGW (scripts/local-s3): data, errors, faults, and sbatch jobs
on the local cluster that stage from and to RGW as bbuser1 with bbuser1's own credentials."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from bbstage.movers import MoverOptions, TransferError
from bbstage.movers.implementations.s3 import S3Download, direct
from bbstage.movers.implementations.s3.settings import S3Options
from bbstage.transfer import Planned, TransferSpec
from tests.helpers import Conn, make_tree, run_worker, s3_sides, tree_digests
from tests.s3env import S3Env, s3  # noqa: F401
from tests.s3fault import FaultProxy

from .conftest import OTHER, USER, Cluster, as_user

SMALL = {"part_size": "5M", "multipart_threshold": "8M", "max_concurrency": 4}


def stage(
    s3: S3Env, src: str, dst: str, user: str = USER, *, endpoint: str | None = None, **conf: Any
) -> Conn:
    """Run a transfer as a worker does, with ``user``'s keys (the administrator-mapped path)."""
    keys = s3.keys(user)
    spec = TransferSpec.between(
        src,
        dst,
        job_id="it",
        **s3_sides(
            {
                "s3": {"endpoint_url": endpoint or s3.endpoint, **conf},
                "credentials": {"key": keys.key, "secret": keys.secret},
            }
        ),
    )
    return run_worker(spec)


def test_tree_small_objects_and_multipart_roundtrip(s3: S3Env, tmp_path: Path) -> None:
    bucket = s3.create_bucket(owner=USER)
    src = make_tree(tmp_path / "src", 400, 8 << 10, digits=4, sub="sub")
    (src / "big.dat").write_bytes(os.urandom(40 << 20))
    stage(s3, f"{src}/", f"s3://{bucket}/run/", **SMALL)
    head = s3.client(USER).head_object(Bucket=bucket, Key="run/big.dat")
    assert head["ContentLength"] == 40 << 20 and head["ETag"].strip('"').endswith("-8")
    for concurrency in (1, 4):
        dst = tmp_path / f"dst{concurrency}"
        conn = stage(
            s3, f"s3://{bucket}/run/", f"{dst}/", download_concurrency=concurrency, **SMALL
        )
        assert Planned(400 * (8 << 10) + (40 << 20), 401) in conn.events
        assert tree_digests(dst) == tree_digests(src)
    # Everything is current now: nothing moves in either direction.
    assert Planned(0, 0) in stage(s3, f"{src}/", f"s3://{bucket}/run/").events
    assert Planned(0, 0) in stage(s3, f"s3://{bucket}/run/", f"{tmp_path}/dst1/").events


def test_empty_objects_on_rgw_and_one_that_grew_after_planning(s3: S3Env, tmp_path: Path) -> None:
    """An empty object is asked for with a Range (one byte past its planned size), which
    RGW refuses for an empty object: it arrives empty. One planned empty that has grown
    since is refused, having read one byte of it."""
    bucket = s3.create_bucket(owner=USER)
    client = s3.client(USER)
    client.put_object(Bucket=bucket, Key="t/empty", Body=b"")
    client.put_object(Bucket=bucket, Key="t/full", Body=b"z" * 1000)
    stage(s3, f"s3://{bucket}/t/", f"{tmp_path}/dst/")
    assert {p.name: p.read_bytes() for p in (tmp_path / "dst").iterdir()} == {
        "empty": b"",
        "full": b"z" * 1000,
    }

    keys = s3.keys(USER)
    conf = {
        "s3": {"endpoint_url": s3.endpoint},
        "credentials": {"key": keys.key, "secret": keys.secret},
    }
    mover = S3Download(MoverOptions(source=S3Options(**conf)))
    [task] = mover.plan(f"s3://{bucket}/t/empty", str(tmp_path / "grown"), tree=False, glob=False)
    client.put_object(Bucket=bucket, Key="t/empty", Body=os.urandom(3 << 20))
    failed = mover.copy_many([task], _NoProgress(), threading.Event(), lambda t: None)
    mover.close()
    assert "changed while staging: it has more than 0 bytes" in str(failed[task])
    assert not (tmp_path / "grown").exists()


class _NoProgress:
    def add(self, n: int) -> None:
        pass

    def temp(self, path: str) -> None:
        pass


def test_big_objects_with_odd_keys_come_straight_into_the_file(
    s3: S3Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big GETs go through s3/direct.py (http.client, signed by botocore): RGW checks the
    signatures of keys that need quoting, streamed and in ranges, and the bytes are whole."""
    bucket = s3.create_bucket(owner=USER)
    src = tmp_path / "src"
    (src / "odd dir").mkdir(parents=True)
    (src / "odd dir" / "ä ö+%20&=?#~;,.dat").write_bytes(os.urandom(11 << 20))
    (src / "plain.dat").write_bytes(os.urandom(9 << 20))
    stage(s3, f"{src}/", f"s3://{bucket}/o d/", **SMALL)
    calls = []
    real = direct.DirectGet.get

    async def spy(self: Any, bucket: str, key: str, *a: Any) -> None:
        calls.append(key)
        await real(self, bucket, key, *a)

    monkeypatch.setattr(direct.DirectGet, "get", spy)
    for concurrency in (1, 2):
        dst = tmp_path / f"dst{concurrency}"
        stage(s3, f"s3://{bucket}/o d/", f"{dst}/", download_concurrency=concurrency, **SMALL)
        assert tree_digests(dst) == tree_digests(src)
    # one GET each streamed; two equal ranges each (of 5.5 and 4.5 MiB, above part_size)
    assert "o d/odd dir/ä ö+%20&=?#~;,.dat" in calls and len(calls) == 2 + 2 + 2


def fast_of(s3: S3Env, user: str) -> Any:
    """What the lean clients (DirectList, DirectHead) ask of ``FastS3``, with ``user``'s keys."""
    from bbstage.movers.implementations.s3.settings import S3Settings

    keys = s3.keys(user)

    class Fast:
        endpoint, region, settings = s3.endpoint, "us-east-1", S3Settings()

        @staticmethod
        async def credentials() -> tuple[str, str, None]:
            return keys.key, keys.secret, None

    return Fast()


def test_lean_listing_reads_rgw_as_botocore_does(s3: S3Env, tmp_path: Path) -> None:
    """s3/listing.py on RGW: real signatures of an odd prefix and tokens, keys XML cannot
    carry, pages of 1,000; a wrong secret on a LIST says what to fix."""
    from bbstage.movers.implementations.s3.fast import FastS3
    from bbstage.movers.implementations.s3.listing import DirectList
    from bbstage.movers.implementations.s3.settings import S3Settings

    bucket = s3.create_bucket(owner=USER)
    client = s3.client(USER)
    prefix = "p ä+%/"
    names = ["ctl\x01x", "a b", "plus+", "é", "a//b", "dir/", "amp&<>", "q?x#"]
    names += [str(n) for n in range(1100)]
    for name in names:
        client.put_object(Bucket=bucket, Key=prefix + name, Body=b"x")
    keys = s3.keys(USER)

    async def ours() -> list[tuple[str, int]]:
        lister, out, token = DirectList(fast_of(s3, USER)), [], None
        while True:
            page = await lister.page(bucket, prefix, token)
            out += [(o["Key"], o["Size"]) for o in page["Contents"]]
            token = page.get("NextContinuationToken")
            if not token:
                return out

    theirs = [
        (o["Key"], o["Size"])
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page["Contents"]
    ]
    import asyncio

    assert asyncio.run(ours()) == theirs and len(theirs) == len(names)
    assert FastS3.available(S3Settings(), s3.endpoint)  # so trees are listed this way
    spec = TransferSpec.between(
        f"s3://{bucket}/{prefix}",
        f"{tmp_path}/x/",
        job_id="it",
        **s3_sides(
            {
                "s3": {"endpoint_url": s3.endpoint},
                "credentials": {"key": keys.key, "secret": "wrong" + keys.secret[5:]},
            }
        ),
    )
    with pytest.raises(TransferError, match="bad S3 credentials for the credentials") as e:
        run_worker(spec)
    assert e.value.permanent and "SignatureDoesNotMatch" in str(e.value)


def test_lean_head_reads_rgw_as_botocore_does(s3: S3Env) -> None:
    """s3/head.py on RGW: real signatures of odd keys; size, time, ETag and user metadata
    as botocore reads them. (Its refusals: the test below stages single objects.)"""
    import asyncio

    from bbstage.movers.implementations.s3.head import DirectHead

    bucket = s3.create_bucket(owner=USER)
    client = s3.client(USER)

    def fields(answer: dict[str, Any]) -> tuple[Any, ...]:
        meta = {k.lower(): v for k, v in answer["Metadata"].items()}
        return answer["ContentLength"], answer["LastModified"], answer["ETag"], meta

    for name in ["p ä+%/ctl\x01x", "a b", "plus+", "q?x#", "~t;,=&"]:
        client.put_object(Bucket=bucket, Key=name, Body=name.encode(), Metadata={"m": "v 1"})
        ours = asyncio.run(DirectHead(fast_of(s3, USER)).head(bucket, name))
        assert fields(ours) == fields(client.head_object(Bucket=bucket, Key=name))
        assert ours["Metadata"] == {"m": "v 1"}


def test_errors_name_the_url_and_the_users_own_credentials_are_enforced(
    s3: S3Env, tmp_path: Path
) -> None:
    mine = s3.create_bucket(owner=USER)
    theirs = s3.create_bucket(owner=OTHER)
    s3.client(OTHER).put_object(Bucket=theirs, Key="secret.dat", Body=b"not yours")
    (tmp_path / "f").write_bytes(b"data")

    with pytest.raises(TransferError, match=rf"no such object: s3://{mine}/missing") as e:
        stage(s3, f"s3://{mine}/missing", str(tmp_path / "x"))
    assert e.value.permanent
    with pytest.raises(TransferError, match=rf"access denied: s3://{theirs}/secret.dat") as e:
        stage(s3, f"s3://{theirs}/secret.dat", str(tmp_path / "x"))
    assert e.value.permanent
    with pytest.raises(TransferError, match=rf"access denied: s3://{theirs}/"):
        stage(s3, str(tmp_path / "f"), f"s3://{theirs}/planted")
    assert not (tmp_path / "x").exists()

    # A wrong secret: RGW refuses the signature; permanent, and says what to fix.
    keys = s3.keys(USER)
    spec_extra = {"key": keys.key, "secret": "wrong" + keys.secret[5:]}
    spec = TransferSpec.between(
        f"s3://{mine}/k",
        str(tmp_path / "y"),
        job_id="it",
        **s3_sides({"s3": {"endpoint_url": s3.endpoint}, "credentials": spec_extra}),
    )
    with pytest.raises(TransferError, match="bad S3 credentials for the credentials") as e:
        run_worker(spec)
    assert e.value.permanent and "SignatureDoesNotMatch" in str(e.value)


def test_slowdown_and_dropped_connections_are_retried(s3: S3Env, tmp_path: Path) -> None:
    bucket = s3.create_bucket(owner=USER)
    src = make_tree(tmp_path / "src", 60, 64 << 10, digits=4, sub="sub")
    (src / "big.dat").write_bytes(os.urandom(24 << 20))
    with FaultProxy(s3.endpoint, slowdown=0.15, drop=0.1, truncate=0.05, seed=7) as proxy:
        stage(s3, f"{src}/", f"s3://{bucket}/f/", endpoint=proxy.url, retries=5, **SMALL)
        dst = tmp_path / "dst"
        stage(s3, f"s3://{bucket}/f/", f"{dst}/", endpoint=proxy.url, retries=5, **SMALL)
    assert proxy.stats.faults > 5
    assert tree_digests(dst) == tree_digests(src)
    assert s3.client(USER).list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_lost_replies_to_multipart_calls_leave_no_upload_behind(s3: S3Env, tmp_path: Path) -> None:
    """A create whose reply is lost is retried and leaves an upload nobody knows the id of;
    an abort whose reply is lost is retried and finds the upload gone. Neither may leave an
    upload behind (each is stored, and billed, until aborted)."""
    bucket = s3.create_bucket(owner=USER)
    src = tmp_path / "big.dat"
    src.write_bytes(os.urandom(10 << 20))
    client = s3.client(USER)

    # Two creates' replies lost, then the first abort's: both strays are still aborted.
    lost = {"POST": ["drop_response"] * 2, "DELETE": ["drop_response"]}
    with FaultProxy(s3.endpoint, script=lost) as proxy:
        stage(s3, str(src), f"s3://{bucket}/ok.dat", endpoint=proxy.url, **SMALL)
    assert proxy.stats.drop_response == 3
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    got = client.get_object(Bucket=bucket, Key="ok.dat")["Body"].read()
    assert hashlib.sha256(got).digest() == hashlib.sha256(src.read_bytes()).digest()

    # Every create's reply lost: the transfer fails, and the uploads it began are aborted.
    with FaultProxy(s3.endpoint, script={"POST": ["drop_response"] * 99}) as proxy:
        with pytest.raises(TransferError):
            stage(s3, str(src), f"s3://{bucket}/lost.dat", endpoint=proxy.url, **SMALL)
    assert proxy.stats.drop_response >= 3
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


# -- through the real cluster: sbatch as bbuser1, the daemon's worker with bbuser1's ~/.aws ---


@pytest.mark.cluster
def test_sbatch_stages_in_from_and_out_to_rgw_as_the_user(
    s3: S3Env, cluster: Cluster, workdir: Path
) -> None:
    bucket = s3.create_bucket(owner=USER)
    client = s3.client(USER)
    data = os.urandom(3 << 20)
    client.put_object(Bucket=bucket, Key="in/input.dat", Body=data)
    for i in range(30):
        client.put_object(Bucket=bucket, Key=f"in/refs/r{i}.txt", Body=f"ref {i}\n".encode())
    fast = workdir / "fast"
    fast.mkdir()
    as_user(workdir)
    job = cluster.submit(
        workdir,
        f"""#!/bin/bash
#BB_LUA stage_in source=s3://{bucket}/in/input.dat destination={fast}/input.dat
#BB_LUA stage_in source=s3://{bucket}/in/refs/ destination={fast}/refs/
#BB_LUA stage_out source={fast}/result.dat destination=s3://{bucket}/out/result.dat
#BB_LUA stage_out source={fast}/outdir/ destination=s3://{bucket}/out/dir/
test -f {fast}/input.dat || exit 3
mkdir -p {fast}/outdir/sub
cat {fast}/input.dat {fast}/refs/r7.txt > {fast}/result.dat
for i in 1 2 3; do echo $i > {fast}/outdir/sub/o$i; done
""",
    )
    cluster.wait_gone(job, timeout=180)
    assert cluster.job(job)["JobState"] == "COMPLETED"
    assert (fast / "input.dat").read_bytes() == data
    assert (fast / "input.dat").stat().st_uid == (fast / "refs").stat().st_uid != 0
    assert len(list((fast / "refs").iterdir())) == 30
    out = client.get_object(Bucket=bucket, Key="out/result.dat")["Body"].read()
    assert out == data + b"ref 7\n"
    assert client.get_object(Bucket=bucket, Key="out/dir/sub/o2")["Body"].read() == b"2\n"
    status = cluster.status(job)
    assert [d["state"] for d in status["directives"]] == ["done"] * 4


def held(cluster: Cluster, workdir: Path, directive: str, text: str) -> str:
    job = cluster.submit(workdir, f"#!/bin/bash\n{directive}\ntrue\n")
    try:
        info = cluster.wait(job, lambda j: text in j.get("Reason", ""), timeout=90)
        assert info["JobState"] == "PENDING"
        return info["Reason"]
    finally:
        cluster.run("scancel", job)


@pytest.mark.cluster
def test_a_profile_the_user_does_not_have_holds_the_job(
    s3: S3Env, cluster: Cluster, workdir: Path
) -> None:
    bucket = s3.create_bucket(owner=USER)
    s3.client(USER).put_object(Bucket=bucket, Key="k", Body=b"x")
    name = f"nosuch{uuid.uuid4().hex[:6]}"
    reason = held(
        cluster,
        workdir,
        f"#BB_LUA stage_in source=s3://{bucket}/k destination={workdir}/k profile={name}",
        f"no S3 profile '{name}'",
    )
    assert "~/.aws/credentials" in reason


@pytest.mark.cluster
def test_another_users_bucket_is_refused_with_the_users_own_credentials(
    s3: S3Env, cluster: Cluster, workdir: Path
) -> None:
    theirs = s3.create_bucket(owner=OTHER)
    s3.client(OTHER).put_object(Bucket=theirs, Key="private.dat", Body=b"bbuser2's")
    held(
        cluster,
        workdir,
        f"#BB_LUA stage_in source=s3://{theirs}/private.dat destination={workdir}/p.dat",
        f"access denied: s3://{theirs}/private.dat",
    )
    assert not (workdir / "p.dat").exists()
