"""Fair share: light users' wait for a transfer slot behind a heavy user, FIFO against the
scheduler, in one run.

One heavy user (nobody) queues many large transfers at once; three light users (daemon,
bin, sys) each submit a small transfer every few seconds meanwhile. The same work runs
twice through ``bbstage.executor.TransferExecutor`` with real worker processes: once with
``policy = "fifo"`` (the former first-come-first-served queue) and once with ``fair``.
Measured: each light transfer's wait from the request (``submit``) to its start (the
worker's first event), p50 and p99 per policy, and the total throughput (all bytes over
the time from the first request to the last end). Goals (issue #36): light users' p99 wait
under ``fair`` ≤ 2 s while FIFO's is long; throughput ≥ 0.95× FIFO's.

Under FIFO a light transfer waits for the heavy backlog queued before it, so its wait
grows with that backlog (bytes queued / throughput). Each run is stored as one setting
(``<heavy> x <size>``) of benchmarks/results/fairness.json beside those of earlier runs, so
the section shows the wait at several backlogs: ``--heavy 100 --size 128M`` (~15 s of
backlog here) and ``--heavy 600 --size 128M`` (the backlog of a minute or more). The
throughput ratio means something only when the backlog outlasts the light users' schedule
(``light_jobs × light_every``); otherwise both policies wait for the last light request, and
the section says so. The 1-minute load average is recorded before each policy's run.

Usage (root): ``bench_fairness.py [--heavy 100] [--size 128M] [--light-every 1.5]
[--light-jobs 12] [--slots 4] [--dir /var/tmp]``. Each heavy transfer copies one source
file to its own destination, removed when it ends (disk: ``slots`` × size at a time).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import common  # first: puts the checkout on sys.path

from bbstage.executor import TransferExecutor
from bbstage.identity import Identity
from bbstage.transfer import Done, TransferSpec
from bbstage.units import parse_size

HEAVY = Identity(65534, 65534, (65534,))
LIGHT = {"daemon": Identity(1, 1, (1,)), "bin": Identity(2, 2, (2,)), "sys": Identity(3, 3, (3,))}
SMALL = 1 << 20
GOAL = {"max_p99_s": 2.0, "min_throughput_ratio": 0.95}


def percentile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def run(policy: str, area: Path, big: Path, small: Path, args: Any) -> dict[str, Any]:
    """The whole load under one policy: each light transfer's wait, the throughput."""
    ex = TransferExecutor(args.slots, policy=policy, stall_timeout=600)
    out = area / policy
    out.mkdir()
    out.chmod(0o1777)
    started: dict[str, float] = {}
    asked: dict[str, float] = {}
    lock = threading.Lock()
    futures: list[Future[Done]] = []

    def submit(key: str, src: Path, who: Identity) -> None:
        def first(_event: Any) -> None:
            with lock:
                started.setdefault(key, time.monotonic())

        asked[key] = time.monotonic()
        future = ex.submit(key, TransferSpec.between(str(src), str(out / key)), who, first)
        future.add_done_callback(lambda _f: (out / key).unlink(missing_ok=True))
        if key.startswith("heavy-"):
            future.add_done_callback(lambda _f: ended.append(time.monotonic()))
        futures.append(future)

    load = os.getloadavg()[0]
    ended: list[float] = []
    begin = time.monotonic()
    try:
        for i in range(args.heavy):
            submit(f"heavy-{i}", big, HEAVY)
        for round_ in range(args.light_jobs):
            time.sleep(args.light_every)
            for name, who in LIGHT.items():
                submit(f"{name}-{round_}", small, who)
        for future in futures:
            future.result(timeout=3600)
        seconds = time.monotonic() - begin
    finally:
        ex.shutdown()
        shutil.rmtree(out, ignore_errors=True)
    waits = {
        name: [started[k] - asked[k] for k in asked if k.startswith(f"{name}-")] for name in LIGHT
    }
    every = [w for ws in waits.values() for w in ws]
    total = args.heavy * big.stat().st_size + len(every) * SMALL
    return {
        "load_1min": load,
        "heavy_done_s": round(max(ended) - begin, 2),
        "light_schedule_s": args.light_jobs * args.light_every,
        "seconds": round(seconds, 2),
        "bytes": total,
        "throughput_mb_s": round(total / seconds / 1e6, 1),
        "light_wait_s": {
            name: {"p50": round(percentile(ws, 50), 3), "p99": round(percentile(ws, 99), 3)}
            for name, ws in waits.items()
        },
        "all_light": {
            "p50": round(percentile(every, 50), 3),
            "p99": round(percentile(every, 99), 3),
            "max": round(max(every), 3),
        },
    }


def markdown(settings: dict[str, dict[str, Any]]) -> str:
    """The section: one table row per (setting, policy), then the goals per setting."""
    first = next(iter(settings.values()))["params"]
    lines = [
        "`benchmarks/bench_fairness.py`: one heavy user queues N transfers of S MiB at once; "
        f"three light users each ask for a 1 MiB transfer every {first['light_every']} s "
        f"({first['light_jobs']} each), through the local executor with {first['slots']} "
        "slots and real worker processes; the same load with the former "
        "first-come-first-served queue (`fifo`) and with the scheduler (`fair`), in one run "
        "per setting. Wait: from the request to the transfer's start (its worker's first "
        "event). Heavy done: when the last heavy transfer ended (FIFO: the backlog a light "
        "request can wait for). Load: 1-minute load average before the policy's run (2 CPUs, "
        "shared with other work).",
        "",
        "| setting | policy | light p50 wait (s) | light p99 wait (s) | light max (s) "
        "| each light user p50 / p99 (s) | heavy done (s) | total (s) | throughput (MB/s) "
        "| load |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, result in settings.items():
        for policy in ("fifo", "fair"):
            r = result[policy]
            a = r["all_light"]
            users = ", ".join(
                f"{u} {w['p50']:.2f} / {w['p99']:.2f}" for u, w in r["light_wait_s"].items()
            )
            lines.append(
                f"| {name} | {policy} | {a['p50']:.2f} | {a['p99']:.2f} | {a['max']:.2f} | "
                f"{users} | "
                f"{r.get('heavy_done_s', float('nan')):.1f} | {r['seconds']:.1f} | "
                f"{r['throughput_mb_s']:.0f} | {r.get('load_1min', float('nan')):.2f} |"
            )
    lines += ["", "Goals per setting:", ""]
    for name, result in settings.items():
        fifo, fair = result["fifo"], result["fair"]
        ratio, p99 = result["throughput_ratio"], fair["all_light"]["p99"]
        bound = fifo.get("heavy_done_s", 0) < fifo.get("light_schedule_s", 0)
        lines.append(
            f"* {name} ({result['environment']['date']}): light p99 under `fair` {p99:.2f} s "
            f"≤ {GOAL['max_p99_s']:g} s: {'met' if p99 <= GOAL['max_p99_s'] else '**NOT met**'}"
            f"; FIFO's p99 {fifo['all_light']['p99']:.1f} s; throughput {ratio:.2f}× FIFO's "
            f"≥ {GOAL['min_throughput_ratio']}: "
            f"{'met' if ratio >= GOAL['min_throughput_ratio'] else '**NOT met**'}"
            + (
                " (not a throughput test: the heavy backlog ended before the light users' "
                "last request, so both runs last as long as the light schedule)."
                if bound
                else "."
            )
        )
    lines += [
        "",
        "Under FIFO a light request waits for the heavy backlog queued ahead of it: its wait "
        "grows linearly with that backlog (bytes queued / throughput), so a backlog of hours "
        "makes waits of hours; under `fair` it does not depend on the backlog.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = common.parser(__doc__)
    ap.add_argument("--heavy", type=int, default=100)
    ap.add_argument("--size", default="128M")
    ap.add_argument("--light-every", type=float, default=1.5)
    ap.add_argument("--light-jobs", type=int, default=12)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    if os.geteuid() != 0:
        common.fail("run as root: workers drop to the users' identities")
    area = Path(tempfile.mkdtemp(prefix="bbstage-bench-fairness-", dir=args.dir))
    area.chmod(0o1777)
    try:
        big, small = area / "big", area / "small"
        big.write_bytes(os.urandom(parse_size(args.size)))
        small.write_bytes(os.urandom(SMALL))
        big.chmod(0o644)
        small.chmod(0o644)
        result: dict[str, Any] = {}
        for policy in ("fifo", "fair"):
            print(f"bench_fairness: {policy} ...", flush=True)
            result[policy] = run(policy, area, big, small, args)
            print(f"  {result[policy]}", flush=True)
    finally:
        shutil.rmtree(area, ignore_errors=True)
    result["throughput_ratio"] = round(
        result["fair"]["throughput_mb_s"] / result["fifo"]["throughput_mb_s"], 3
    )
    result["params"] = {
        "heavy": args.heavy,
        "size_mib": parse_size(args.size) >> 20,
        "light_every": args.light_every,
        "light_jobs": args.light_jobs,
        "slots": args.slots,
    }
    result["environment"] = common.environment()
    stored = common.load_result("fairness")
    settings = stored.get("settings") or ({"100 x 128 MiB": stored} if "fifo" in stored else {})
    settings[f"{args.heavy} x {parse_size(args.size) >> 20} MiB"] = result
    settings = dict(sorted(settings.items(), key=lambda kv: kv[1]["fifo"]["bytes"]))
    document = {
        "title": "Fair share: light users behind a heavy one",
        "goal": GOAL,
        "settings": settings,
        "markdown": markdown(settings),
    }
    common.save_result("fairness", document, doc=not args.no_doc)
    print(document["markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
