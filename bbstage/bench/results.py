"""The result dict ``bbstage bench`` prints as JSON (and benchmarks/ store): medians,
latency percentiles, the median run's samples, and where it was measured."""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from bbstage.bench.model import Options, Run


def percentiles(values: list[float]) -> dict[str, float] | None:
    """p50/p90/p99/max/mean of ``values`` (seconds) in milliseconds."""
    if not values:
        return None
    ms = sorted(v * 1e3 for v in values)

    def pick(q: float) -> float:
        return ms[min(len(ms) - 1, max(0, math.ceil(q * len(ms)) - 1))]

    return {
        "p50": pick(0.50),
        "p90": pick(0.90),
        "p99": pick(0.99),
        "max": ms[-1],
        "mean": statistics.fmean(ms),
    }


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.seconds)[(len(runs) - 1) // 2]


def summary(runs: list[Run]) -> dict[str, Any]:
    """The median run's rates, and every run's."""
    mid = median_run(runs)
    return {
        "seconds": mid.seconds,
        "mb_per_s": mid.mb_per_s,
        "files_per_s": mid.files_per_s,
        "runs": [
            {"seconds": r.seconds, "mb_per_s": r.mb_per_s, "files_per_s": r.files_per_s}
            for r in runs
        ],
    }


def result(
    opts: Options, mover: str, runs: list[Run], *, cache: str, settings: dict[str, Any]
) -> dict[str, Any]:
    """Our side of the result; the caller adds the baselines."""
    plan, ours = opts.plan, median_run(runs)
    return {
        "source": opts.source,
        "destination": opts.destination,
        "mover": mover,
        "files": plan.files,
        "file_size": plan.file_size,
        "total_bytes": plan.total,
        **settings,
        "checksum": opts.checksum,
        "cache": cache,
        "repeat": opts.repeat,
        **summary(runs),
        "latency_ms": percentiles(ours.latencies),
        "samples": [list(s) for s in ours.samples],
        "baselines": {},
        "environment": environment(),
    }


def environment() -> dict[str, str]:
    """Where the numbers were measured."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu,
        "cpus": str(os.cpu_count()),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
