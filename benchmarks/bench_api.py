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
        path.write_text(json.dumps({"name": "api", "results": results}, indent=2) + "\n")
    finally:
        d.stop()
        remove(munged)


if __name__ == "__main__":
    main()
