"""[R] #37: request latency of the network API against the local socket, and of
`bbstage copy` (the request: the copy itself runs in the background), against a real daemon
and a real munged started here (tests/hookharness.py, tests/mungeharness.py).

Measured in-process through bbstage.client (what the CLI and bbstage.api call): one
connection and, over the API, one munge credential per request. Goal: p50 < 5 ms.
The throughput comparison of an in-job copy against a stage-out (issue #37) is NOT measured
yet. Writes benchmarks/results/api.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bbstage import client  # noqa: E402
from tests.helpers import free_port  # noqa: E402
from tests.hookharness import script, start_daemon, user_ids, user_tree  # noqa: E402
from tests.mungeharness import remove, start_munged  # noqa: E402

N = 300
TITLE = "Network API: request latency"
ROWS = {
    "status_socket": "`bbstage status`, local Unix socket",
    "status_api": "`bbstage status`, network API (munge)",
    "copy_api": "`bbstage copy` request, network API (munge)",
}


def markdown(results: dict[str, dict[str, float]]) -> str:
    """The section of docs/performance.md (benchmarks/report.py renders it as it is)."""
    lines = [
        "`benchmarks/bench_api.py`: a real daemon and a real munged on this machine, requests",
        "made in-process through `bbstage.client` (what the CLI and `bbstage.api` call), one",
        "connection and (API) one munge credential each. Goal: p50 < 5 ms.",
        "",
        "| request | p50 (ms) | p99 (ms) | n | goal |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for key, label in ROWS.items():
        r = results[key]
        met = "met" if r["p50_ms"] < 5 else "**not met**"
        lines.append(f"| {label} | {r['p50_ms']:.2f} | {r['p99_ms']:.1f} | {r['n']:.0f} | {met} |")
    lines += [
        "",
        "Not measured yet: the throughput of an in-job copy against the same file staged out",
        "at the job's end (issue #37's second goal), and the latency seen by a CLI process",
        "(its start-up adds far more than these requests).",
    ]
    return "\n".join(lines) + "\n"


def timed(call: object, n: int = N) -> dict[str, float]:
    seconds = []
    for _ in range(n):
        t = time.perf_counter()
        call()  # type: ignore[operator]
        seconds.append(time.perf_counter() - t)
    seconds.sort()
    return {"p50_ms": round(statistics.median(seconds) * 1000, 3),
            "p99_ms": round(seconds[int(len(seconds) * 0.99) - 1] * 1000, 3), "n": n}  # fmt: skip


def main() -> None:
    base = Path("/var/tmp/bbstage-tests") / f"bench-api-{uuid.uuid4().hex[:6]}"
    base.mkdir(parents=True, mode=0o755)
    munged = start_munged(base)
    port = free_port()
    d = start_daemon(base / "d", extra=(f'metrics_address = ""\napi_address = "127.0.0.1:{port}"\n'
                     f'munge_socket = "{munged.socket}"\njob_check = "state"'))  # fmt: skip
    try:
        uid, gid = user_ids()
        job = script(base / "job.sh")
        d.hook("slurm_bb_setup", "900", str(uid), str(gid), "(null)", "0", job)
        d.hook("slurm_bb_data_in", "900", job)
        d.hook("slurm_bb_pre_run", "900", job)
        scratch = d.root / "scratch" / "900"
        (scratch / "f").write_bytes(b"x" * 4096)
        out = base / "out"
        out.mkdir()
        user_tree(out, uid, gid)
        user_tree(scratch, uid, gid)
        # As the job's user (the copy op checks the owner): drop to it for the copy requests.
        sock = client.Target(socket=d.root / "run" / "user.sock")
        api = client.Target(api=f"127.0.0.1:{port}", munge_socket=munged.socket)
        results = {
            "status_socket": timed(lambda: client.call(sock, "status", job_id="900")),
            "status_api": timed(lambda: client.call(api, "status", job_id="900")),
        }
        os.setegid(gid)
        os.seteuid(uid)
        try:
            counter = iter(range(10**6))
            results["copy_api"] = timed(lambda: client.call(
                api, "copy", job_id="900", source="$BB_SCRATCH/f",
                destination=f"{out}/f{next(counter)}"), n=200)  # fmt: skip
        finally:
            os.seteuid(0)
            os.setegid(0)
        results["goal"] = "p50 < 5 ms"  # type: ignore[assignment]
        print(json.dumps(results, indent=2))
        path = REPO / "benchmarks" / "results" / "api.json"
        document = {"name": "api", "title": TITLE, "results": results}
        path.write_text(json.dumps({**document, "markdown": markdown(results)}, indent=2) + "\n")
    finally:
        d.stop()
        remove(munged)


if __name__ == "__main__":
    main()
