#!/usr/bin/env python3
"""A single user's figures at two commits, in one run: bench_posix and bench_s3 of each.

"Unchanged within noise" (issues #36 and #38) as a measured statement: both commits are
checked out into temporary git worktrees (``git worktree add --detach`` under /var/tmp,
removed at the end) and each one's own ``benchmarks/bench_posix.py`` and
``benchmarks/bench_s3.py`` run with that tree's ``bbstage`` (``PYTHONPATH`` = the
worktree; checked before the first run), alternately: round 1 runs OLD then NEW, round 2
NEW then OLD, and so on, each benchmark of both commits back to back. Every worktree gets
this checkout's ``scripts/local-s3`` (its ``up`` is idempotent and never restarts the shared
RGW), and the S3 runs use bbstage and s5cmd only (s5cmd as a witness of the machine's load
in the same invocation).

For each figure (bbstage's MB/s or files/s of one case) the report gives the medians of
all of each commit's samples and their ratio NEW/OLD, the range of the per-round ratios
(each round's NEW median over its OLD median), each commit's own spread (half the range
of its samples over their median) and the ratio normalised by the baseline measured in
the same invocation (cp, s5cmd). Verdict: "within noise" when |ratio - 1| is at most the
larger of the two commits' own spreads, otherwise "faster" or "slower"; "(every round
slower)" (or faster) is added when all per-round ratios fall on one side of 1. The 1-minute load
average is recorded before every invocation.

Writes benchmarks/results/compare_<label>.json (its ``markdown`` is the section of
docs/performance.md), then regenerates the document unless --no-doc.

Usage (root, scripts/local-s3 running): python3 benchmarks/compare_commits.py OLD NEW
    [--label NAME] [--rounds 4] [--only posix,s3]
    [--posix-args "--repeat 2 --big-size 1G --small-files 2000"]
    [--s3-args "--rounds 1 --big-mib 256 --small 200 --contenders bbstage,s5cmd"]
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, environment, fail, parser, save_result

POSIX_ARGS = "--repeat 2 --big-size 1G --small-files 2000 --small-size 4K"
S3_ARGS = "--rounds 1 --big-mib 256 --small 200 --small-kib 64 --contenders bbstage,s5cmd"


def git(*argv: str) -> str:
    proc = subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        fail(f"git {' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


class Tree:
    """One commit checked out in a temporary worktree, its benchmarks run from there."""

    def __init__(self, rev: str, name: str) -> None:
        self.commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
        self.name, self.short = name, self.commit[:7]
        self.subject = git("log", "-1", "--format=%s", self.commit)
        self.dir = Path(tempfile.mkdtemp(prefix=f"bbstage-compare-{self.short}-", dir="/var/tmp"))
        git("worktree", "add", "--detach", str(self.dir), self.commit)
        self.dir.chmod(0o755)  # the S3 bench's workers run as bbuser1 and import from here
        shutil.copy2(REPO / "scripts" / "local-s3", self.dir / "scripts" / "local-s3")
        self.env = {**os.environ, "PYTHONPATH": str(self.dir)}
        where = self.python(["-c", "import bbstage; print(bbstage.__file__)"]).strip()
        if not where.startswith(str(self.dir) + "/"):
            fail(f"{self.short}: bbstage imported from {where}, not from {self.dir}")

    def python(self, argv: list[str]) -> str:
        proc = subprocess.run(
            [sys.executable, *argv], cwd=self.dir, env=self.env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            fail(f"{self.short}: {' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
        return proc.stdout

    def bench(self, name: str, args: list[str]) -> dict[str, Any]:
        """Run this tree's bench_<name>.py; its results file (written in the worktree)."""
        results = self.dir / "benchmarks" / "results" / f"{name}.json"
        results.unlink(missing_ok=True)  # a stored one would merge into --only runs
        self.python([f"benchmarks/bench_{name}.py", "--no-doc", *args])
        return json.loads(results.read_text())

    def remove(self) -> None:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(self.dir)],
            capture_output=True,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


def posix_samples(result: dict[str, Any]) -> dict[str, tuple[list[float], list[float], str]]:
    """Figure -> (bbstage's samples, the baseline's samples, unit) of one bench_posix run."""
    out = {}
    for case, metric, unit in (("big", "mb_per_s", "MB/s"), ("small", "files_per_s", "files/s")):
        c = result["cases"].get(case)
        if c:
            ours = [r[metric] for r in c["runs"]]
            base = [r[metric] for r in c["baselines"]["cp"]["runs"]]
            out[f"posix {case} ({unit}; baseline cp)"] = (ours, base, unit)
    return out


def s3_samples(result: dict[str, Any]) -> dict[str, tuple[list[float], list[float], str]]:
    """Figure -> (bbstage's samples, s5cmd's samples, unit) of one bench_s3 run."""
    out = {}
    for case, r in result["results"].items():
        unit, amount = ("MB/s", r["bytes"] / 1e6) if case.startswith("big") else (
            "files/s", r["files"])  # fmt: skip
        rate = {who: [amount / s for s in secs] for who, secs in r["seconds"].items()}
        out[f"s3 {case} ({unit}; baseline s5cmd)"] = (rate["bbstage"], rate.get("s5cmd", []), unit)
    return out


def spread(samples: list[float]) -> float:
    """Half the range of ``samples`` over their median."""
    return (max(samples) - min(samples)) / 2 / statistics.median(samples)


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure: the ratio NEW/OLD, its range over the rounds, the noise, the verdict."""
    figures: dict[str, Any] = {}
    for rnd in rounds:
        for fig, (ours, base, unit) in rnd["old"].items():
            if fig not in rnd["new"]:
                continue
            new_ours, new_base, _ = rnd["new"][fig]
            f = figures.setdefault(fig, {"unit": unit, "old": [], "new": [], "old_base": [],
                                         "new_base": [], "round_ratios": []})  # fmt: skip
            f["old"] += ours
            f["new"] += new_ours
            f["old_base"] += base
            f["new_base"] += new_base
            f["round_ratios"].append(statistics.median(new_ours) / statistics.median(ours))
    for f in figures.values():
        old, new = statistics.median(f["old"]), statistics.median(f["new"])
        ratio = new / old
        noise = max(spread(f["old"]), spread(f["new"]))
        f.update(old_median=old, new_median=new, ratio=ratio, noise=noise,
                 old_spread=spread(f["old"]), new_spread=spread(f["new"]))  # fmt: skip
        if f["old_base"] and f["new_base"]:
            f["ratio_vs_baseline"] = (new / statistics.median(f["new_base"])) / (
                old / statistics.median(f["old_base"])
            )
        f["verdict"] = (
            "within noise" if abs(ratio - 1) <= noise else ("faster" if ratio > 1 else "slower")
        )
        rr = f["round_ratios"]
        if len(rr) > 1 and (min(rr) > 1 or max(rr) < 1):
            f["verdict"] += f" (every round {'faster' if min(rr) > 1 else 'slower'})"
    return figures


def markdown(result: dict[str, Any]) -> str:
    old, new, p = result["old"], result["new"], result["params"]
    loads = [r["load_1min"] for r in result["invocations"]]
    lines = [
        f"`benchmarks/compare_commits.py {old['commit'][:7]} {new['commit'][:7]}` "
        f"({result['label']}): OLD = `{old['commit'][:7]}` ({old['subject'][:90]}), NEW = "
        f"`{new['commit'][:7]}` ({new['subject'][:90]}). Each commit's own bench_posix "
        f"(`{p['posix_args']}`) and bench_s3 (`{p['s3_args']}`) from a temporary worktree, "
        f"{p['rounds']} rounds alternating which commit runs first; {result['minutes']:.0f} "
        f"min in all; 1-minute load before each invocation {min(loads):.2f}–{max(loads):.2f} "
        "(2 CPUs shared with other work). Ratio = NEW's median / OLD's median over all "
        "samples; per-round range = each round's NEW median / OLD median; noise = the larger "
        "commit's half-range of its own samples over their median; vs baseline = the ratio "
        "of bbstage / (cp or s5cmd of the same invocation).",
        "",
        "| figure | OLD median | NEW median | NEW/OLD | per-round range | noise ± | "
        "vs baseline | verdict |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for fig, f in result["figures"].items():
        rr = f["round_ratios"]
        vb = f"{f['ratio_vs_baseline']:.2f}" if "ratio_vs_baseline" in f else "–"
        verdict = f["verdict"] if f["verdict"] == "within noise" else f"**{f['verdict']}**"
        lines.append(
            f"| {fig} | {f['old_median']:.0f} | {f['new_median']:.0f} | {f['ratio']:.3f} | "
            f"{min(rr):.2f}–{max(rr):.2f} | {f['noise'] * 100:.0f}% | {vb} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("old", help="the commit before the change")
    ap.add_argument("new", help="the commit after it")
    ap.add_argument("--label", default=None, help="results file compare_<label>.json")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--only", default="posix,s3", help="posix, s3 or both (comma-separated)")
    ap.add_argument("--posix-args", default=POSIX_ARGS)
    ap.add_argument("--s3-args", default=S3_ARGS)
    args = ap.parse_args()
    benches = [b for b in args.only.split(",") if b]
    if not benches or set(benches) - {"posix", "s3"}:
        fail("--only: posix, s3 or posix,s3")
    if os.geteuid() != 0:
        fail("run as root (the page cache is dropped; S3 copies run as bbuser1)")
    bench_args = {"posix": shlex.split(args.posix_args), "s3": shlex.split(args.s3_args)}
    bench_args["posix"] += ["--dir", "/var/tmp/bbstage-compare-posix"]
    samples = {"posix": posix_samples, "s3": s3_samples}

    trees: list[Tree] = []
    begin = time.monotonic()
    rounds: list[dict[str, Any]] = []
    invocations: list[dict[str, Any]] = []
    try:
        trees = [Tree(args.old, "old"), Tree(args.new, "new")]
        for r in range(args.rounds):
            rnd: dict[str, Any] = {"old": {}, "new": {}}
            for bench in benches:
                for tree in trees if r % 2 == 0 else trees[::-1]:
                    load = os.getloadavg()[0]
                    t0 = time.monotonic()
                    result = tree.bench(bench, bench_args[bench])
                    got = samples[bench](result)
                    rnd[tree.name].update(got)
                    invocations.append({"round": r + 1, "bench": bench, "commit": tree.short,
                                        "load_1min": load, "seconds": time.monotonic() - t0,
                                        "samples": got})  # fmt: skip
                    print(
                        f"round {r + 1} {bench} {tree.name} {tree.short} (load {load:.2f}): "
                        + "; ".join(f"{k}: {statistics.median(v[0]):.0f}" for k, v in got.items()),
                        flush=True,
                    )
            rounds.append(rnd)
    finally:
        for tree in trees:
            tree.remove()
    label = args.label or f"{trees[0].short}_{trees[1].short}"
    result: dict[str, Any] = {
        "title": f"Single-user figures across a change: {label}",
        "label": label,
        "old": {"commit": trees[0].commit, "subject": trees[0].subject},
        "new": {"commit": trees[1].commit, "subject": trees[1].subject},
        "params": {"rounds": args.rounds, "posix_args": args.posix_args, "s3_args": args.s3_args},
        "minutes": (time.monotonic() - begin) / 60,
        "invocations": invocations,
        "figures": summarise(rounds),
        "environment": environment(load_average=list(os.getloadavg())),
    }
    result["markdown"] = markdown(result)
    print(result["markdown"])
    save_result(f"compare_{label}", result, doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
