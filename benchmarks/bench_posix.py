#!/usr/bin/env python3
"""POSIX staging throughput vs cp and rsync, through the same code as ``bbstage bench``.

Two cases, each run ``--repeat`` times (ours and cp swap places every other run), medians:

  big     one 4 GiB file vs ``cp``                    goal: ≥ 0.95× cp's MB/s
  small   10,000 × 4 KiB files (1,000 per directory)  goal: ≥ 1.5× ``cp -r``'s files/s
          vs ``cp -r`` and ``rsync -a``

``bbstage.bench.bench`` generates the data under ``--dir``/src, stages it with
``worker.run`` (the daemon's defaults: 8 threads per transfer, 64 MiB chunks) into
``--dir``/dst and times the baselines on the same data, each to a fresh destination; the
page cache is dropped before every copy when permitted (root), else every copy reads a warm
source. Writes benchmarks/results/posix.json, then regenerates docs/performance.md
(benchmarks/report.py) unless --no-doc.

Usage: python3 benchmarks/bench_posix.py [--repeat 5] [--dir /var/tmp/bbstage-bench-posix]
       [--big-size 4G] [--small-files 10000] [--small-size 4K] [--only big|small] [--no-doc]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from common import environment, fail, first_line, load_result, parser, save_result

from bbstage import bench
from bbstage.config import Config
from bbstage.units import parse_size

NAME = "posix"
GOALS = {
    "big": {"baseline": "cp", "metric": "mb_per_s", "min_ratio": 0.95},
    "small": {"baseline": "cp", "metric": "files_per_s", "min_ratio": 1.5},
}


def tool_versions() -> dict[str, str]:
    return {tool: first_line([tool, "--version"]) for tool in ("cp", "rsync") if shutil.which(tool)}


def filesystem(path: Path) -> str:
    """The type of the file system ``path`` is on (``df -T``)."""
    out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True).stdout
    rows = out.splitlines()
    return rows[1].split()[1] if len(rows) > 1 else "?"


def run_case(name: str, plan: bench.Plan, root: Path, repeat: int, cache: str) -> dict:
    src, dst = root / "src", root / "dst"
    src.mkdir(parents=True, exist_ok=True)
    dst.mkdir(parents=True, exist_ok=True)
    opts = bench.Options(
        source=str(src),
        destination=str(dst),
        plan=plan,
        repeat=repeat,
        cache=cache,
        config=Config(),
        progress=sys.stderr.isatty(),
    )
    result = bench.bench(opts)
    goal = GOALS[name]
    base = result["baselines"][goal["baseline"]]
    ratio = base["ratio"]
    result["goal"] = {**goal, "ratio": ratio, "met": ratio >= goal["min_ratio"]}
    rsync = result["baselines"].get("rsync")
    print(
        f"{name}: {plan.files} x {plan.file_size} B: bbstage {result['mb_per_s']:.1f} MB/s "
        f"{result['files_per_s']:.0f} files/s; {base['command']} {base['mb_per_s']:.1f} MB/s "
        f"{base['files_per_s']:.0f} files/s -> {ratio:.2f}x (goal >= {goal['min_ratio']}: "
        f"{'met' if result['goal']['met'] else 'NOT met'})"
        + (f"; rsync -a {rsync['files_per_s']:.0f} files/s, {rsync['ratio']:.2f}x" if rsync else "")
    )
    return result


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--repeat", type=int, default=6, help="runs of each contender (even: balanced)")
    ap.add_argument("--dir", default="/var/tmp/bbstage-bench-posix", help="scratch directory")
    ap.add_argument("--big-size", default="4G")
    ap.add_argument("--small-files", type=int, default=10_000)
    ap.add_argument("--small-size", default="4K")
    ap.add_argument("--cache", default="auto", choices=["auto", "drop", "warm"])
    ap.add_argument("--only", choices=["big", "small"])
    args = ap.parse_args()

    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    plans = {
        "big": bench.Plan(1, parse_size(args.big_size)),
        "small": bench.Plan(args.small_files, parse_size(args.small_size)),
    }
    cases = dict(load_result(NAME).get("cases", {}))
    try:
        for name, plan in plans.items():
            if args.only in (None, name):
                cases[name] = run_case(name, plan, root, args.repeat, args.cache)
    except bench.BenchError as exc:
        fail(str(exc))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "benchmark": "POSIX staging throughput vs cp / rsync (bbstage.bench)",
        "cases": cases,
        "environment": environment(
            filesystem=filesystem(root.parent),
            tools=tool_versions(),
            load_average=list(os.getloadavg()),
        ),
    }
    save_result(NAME, result, doc=not args.no_doc)
    return 0  # a missed goal shows in the report; it is not an error


if __name__ == "__main__":
    sys.exit(main())
