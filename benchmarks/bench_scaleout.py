#!/usr/bin/env python3
"""Scale-out: aggregate throughput of the Dask executor with 1, 2 and 4 transfer nodes.

On the testbed of ``scripts/local-movers`` (a Dask scheduler and N workers as root, each in
a network namespace behind a veth capped with ``tc`` at ``--rate`` MB/s, mutual TLS), two
transfers run through ``DaskExecutor`` exactly as the daemon submits them (a tree is split
into one shard per worker; each shard's copy runs in a child process as the user):

* **s3**: 2,000 × 1 MiB objects (``scripts/local-s3``'s radosgw) → POSIX. Every node
  reaches radosgw through its capped link (``scripts/netns-forward``).
* **posix**: a 2 GiB tree (256 × 8 MiB) → POSIX on the same file system. The namespaces
  share the machine's disk: no link is in this path, so its figure shows the local limit,
  not the nodes' NICs.
* **big**: one 1 GiB object → POSIX: split into byte ranges, one per node
  (``[movers] range_min``, 1 GiB by default), each node GETs its range through its link.

The local executor (worker processes on the daemon's host, no cap) runs the same
transfers as the reference and the uncapped limit. The page cache is dropped before every
run; every run's bytes are checked (MD5 against each object's ETag, SHA-256 against the
source tree) and its rounds rotate the order of N. Goal (issue 16): the rate with N nodes
≥ 0.8 × N × the one-node rate, up to the uncapped limit.

Each run adds its cap's figures (keyed by ``--rate``) to benchmarks/results/scaleout.json,
then regenerates docs/performance.md unless --no-doc.

Usage: python3 benchmarks/bench_scaleout.py [--nodes 1,2,4] [--rate 40] [--rounds 2]
       [--cases s3,posix,big] [--dir /var/tmp/bbstage-scaleout] [--no-doc]   (as root)
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import REPO, check, environment, fail, load_result, parser, rotate, save_result

from bbstage.bench.cache import settle
from bbstage.config import Movers
from bbstage.daemon.dask_executor import DaskExecutor
from bbstage.daemon.executor import TransferExecutor
from bbstage.identity import Identity
from bbstage.transfer import TransferSpec

NAME = "scaleout"
USER = "bbuser1"
BUCKET = "bbstage-scaleout"
OBJECTS, OBJECT_SIZE = 2000, 1 << 20
FILES, FILE_SIZE = 256, 8 << 20
BIG_KEY, BIG_SIZE = "big/one.bin", 1 << 30
GOAL = 0.8  # of N × the one-node rate
MB = 1e6


def exports(argv: list[str]) -> dict[str, str]:
    """The ``export NAME=value`` lines a testbed script prints (its log to our stderr)."""
    out = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True).stdout
    return dict(re.findall(r"export (\w+)=(\S+)", out))


def s3_client(env: dict[str, str]) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["BBSTAGE_S3_BBUSER1_KEY"],
        aws_secret_access_key=env["BBSTAGE_S3_BBUSER1_SECRET"],
        region_name="us-east-1",
    )


def s3_dataset(client: Any) -> dict[str, str]:
    """The bucket of OBJECTS × OBJECT_SIZE objects (made once, kept): key → ETag (MD5)."""
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.ClientError:
        pass  # ours already (BucketAlreadyOwnedByYou)
    have = {
        o["Key"]: o["ETag"].strip('"')
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="in/")
        for o in page.get("Contents", [])
        if o["Size"] == OBJECT_SIZE
    }
    missing = [f"in/d{i % 20:02d}/o{i:05d}" for i in range(OBJECTS)]
    missing = [k for k in missing if k not in have]
    if missing:
        print(f"uploading {len(missing)} objects of {OBJECT_SIZE >> 20} MiB to s3://{BUCKET}/in/")

        def put(key: str) -> tuple[str, str]:
            body = os.urandom(OBJECT_SIZE)
            client.put_object(Bucket=BUCKET, Key=key, Body=body)
            return key, hashlib.md5(body).hexdigest()

        with ThreadPoolExecutor(16) as pool:
            have.update(pool.map(put, missing))
    return {k.removeprefix("in/"): v for k, v in have.items()}


def big_dataset(client: Any) -> dict[str, str]:
    """One BIG_SIZE object (made once, kept; one PUT, so its ETag is its MD5): name → MD5."""
    try:
        head = client.head_object(Bucket=BUCKET, Key=BIG_KEY)
        if head["ContentLength"] == BIG_SIZE and "-" not in head["ETag"]:
            return {"one.bin": head["ETag"].strip('"')}
    except client.exceptions.ClientError:
        pass
    print(f"uploading one object of {BIG_SIZE >> 20} MiB to s3://{BUCKET}/{BIG_KEY}")
    body = os.urandom(BIG_SIZE)
    client.put_object(Bucket=BUCKET, Key=BIG_KEY, Body=body)
    return {"one.bin": hashlib.md5(body).hexdigest()}


def posix_dataset(root: Path, uid: int, gid: int) -> dict[str, str]:
    """The tree of FILES × FILE_SIZE files (made once, kept): relative path → SHA-256."""
    tree = root / "tree"
    if len(list(tree.rglob("f*"))) != FILES:
        shutil.rmtree(tree, ignore_errors=True)
        print(f"writing {FILES} files of {FILE_SIZE >> 20} MiB to {tree}")
        for i in range(FILES):
            path = tree / f"d{i % 8}" / f"f{i:04d}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(FILE_SIZE))
        for p in [tree, *tree.rglob("*")]:
            os.chown(p, uid, gid)
    return digests(tree, "sha256")


def digests(tree: Path, algorithm: str) -> dict[str, str]:
    """Relative path → hex digest of every file under ``tree``."""

    def digest(path: Path) -> str:
        with path.open("rb") as f:
            return hashlib.file_digest(f, algorithm).hexdigest()

    return {str(p.relative_to(tree)): digest(p) for p in sorted(tree.rglob("*")) if p.is_file()}


def cpu_times() -> tuple[int, int]:
    """The machine's busy and total CPU time so far (jiffies, /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def transfer(executor: Any, spec: TransferSpec, identity: Identity) -> dict[str, Any]:
    """Seconds, bytes and files of one transfer through ``executor`` (its ``Done``), and
    the share of the machine's CPUs that were busy meanwhile (everyone's: RGW too)."""
    busy0, total0 = cpu_times()
    started = time.perf_counter()
    done = executor.submit(f"bench:{uuid.uuid4().hex[:8]}", spec, identity, lambda e: None)
    result = done.result(timeout=1800)
    seconds = time.perf_counter() - started
    busy1, total1 = cpu_times()
    cpu = (busy1 - busy0) / max(1, total1 - total0)
    return {"seconds": seconds, "bytes": result.bytes, "files": result.files, "cpu_busy": cpu}


def run_case(
    case: str, executor: Any, root: Path, want: dict[str, str], identity: Identity
) -> dict[str, float]:
    """One timed transfer of ``case`` into a fresh directory, its bytes checked."""
    out = root / f"out-{case}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    os.chown(out, identity.uid, identity.gid)
    source, target, size = {
        "s3": (f"s3://{BUCKET}/in/", f"{out}/", OBJECT_SIZE),
        "posix": (f"{root / 'tree'}/", f"{out}/", FILE_SIZE),
        "big": (f"s3://{BUCKET}/{BIG_KEY}", f"{out}/one.bin", BIG_SIZE),
    }[case]
    spec = TransferSpec.between(source, target, job_id="bench", threads=8)
    settle("drop")
    t = transfer(executor, spec, identity)
    check(
        t["files"] == len(want) and t["bytes"] == len(want) * size,
        f"{case}: {t['files']} files, {t['bytes']} B",
    )
    got = digests(out, "sha256" if case == "posix" else "md5")
    check(got == want, f"{case}: {sum(got.get(k) != v for k, v in want.items())} files differ")
    shutil.rmtree(out)
    return {
        "seconds": t["seconds"],
        "mb_s": t["bytes"] / t["seconds"] / MB,
        "cpu_busy": t["cpu_busy"],
    }


def dask_movers(env: dict[str, str]) -> Movers:
    tls = Path(env["BBSTAGE_MOVERS_TLS"])
    return Movers(
        executor="dask",
        scheduler=env["BBSTAGE_MOVERS_SCHEDULER"],
        tls_ca_file=tls / "ca.pem",
        tls_cert=tls / "client.pem",
        tls_key=tls / "client.key",
    )


def summary(runs: dict[str, dict[str, list[dict[str, float]]]], nodes: list[int]) -> dict:
    """Per case: the best rate of each variant (and the CPUs' busy share in that run), and
    N-node rate ÷ (N × one-node rate)."""
    out: dict[str, Any] = {}
    for case, variants in runs.items():
        top = {v: max(rs, key=lambda r: r["mb_s"]) for v, rs in variants.items()}
        best = {v: r["mb_s"] for v, r in top.items()}
        one = best.get("1")
        efficiency = {str(n): best[str(n)] / (n * one) for n in nodes if one and str(n) in best}
        cpu = {v: r["cpu_busy"] for v, r in top.items()}
        out[case] = {"best_mb_s": best, "efficiency": efficiency, "cpu_busy": cpu}
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--nodes", default="1,2,4", help="numbers of transfer nodes [1,2,4]")
    ap.add_argument("--rate", type=int, default=40, help="each node's link cap, MB/s [40]")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cases", default="s3,posix")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bbstage-scaleout"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        fail("run as root (namespaces, Dask workers as root, dropping the page cache)")
    nodes = [int(n) for n in args.nodes.split(",")]
    cases = args.cases.split(",")
    pw = pwd.getpwnam(USER)
    identity = Identity.of(pw.pw_uid, pw.pw_gid)
    args.dir.mkdir(parents=True, exist_ok=True)
    os.chown(args.dir, pw.pw_uid, pw.pw_gid)

    s3env = exports([str(REPO / "scripts" / "local-s3"), "up"])
    want = {}
    if "s3" in cases:
        want["s3"] = s3_dataset(s3_client(s3env))
    if "posix" in cases:
        want["posix"] = posix_dataset(args.dir, pw.pw_uid, pw.pw_gid)
    if "big" in cases:
        want["big"] = big_dataset(s3_client(s3env))

    runs: dict[str, dict[str, list[dict[str, float]]]] = {c: {} for c in cases}
    movers_script = str(REPO / "scripts" / "local-movers")
    for round_ in range(args.rounds):
        for variant in rotate(["local", *map(str, nodes)], round_):
            if variant == "local":
                executor: Any = TransferExecutor(max_workers=4)
            else:
                env = exports([movers_script, "up", variant, "--rate", str(args.rate)])
                executor = DaskExecutor(dask_movers(env))
            try:
                for case in cases:
                    r = run_case(case, executor, args.dir, want[case], identity)
                    runs[case].setdefault(variant, []).append(r)
                    print(f"round {round_ + 1} {case:5} {variant:>5}: {r['seconds']:6.1f} s "
                          f"{r['mb_s']:7.1f} MB/s, CPUs {r['cpu_busy']:.0%} busy")  # fmt: skip
            finally:
                executor.shutdown()
    result = load_result(NAME) or {"goal_efficiency": GOAL, "rates": {}}
    result["environment"] = environment()
    result["datasets"] = {  # every case's, whichever ran
        "s3": f"{OBJECTS} × {OBJECT_SIZE >> 20} MiB objects → POSIX",
        "posix": f"{FILES} × {FILE_SIZE >> 20} MiB files (2 GiB) → POSIX",
        "big": f"one {BIG_SIZE >> 20} MiB object → POSIX, in byte ranges across the nodes",
    }
    # A run of some cases keeps the other cases' figures at this cap (same nodes).
    old = result["rates"].get(str(args.rate), {})
    if old.get("nodes") == nodes:
        runs = {**old["runs"], **runs}
    result["rates"][str(args.rate)] = {
        "nodes": nodes,
        "rounds": args.rounds,
        "runs": runs,
        "summary": summary(runs, nodes),
    }
    save_result(NAME, result, doc=not args.no_doc)


if __name__ == "__main__":
    main()
