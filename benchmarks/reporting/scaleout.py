"""The section of the scale-out benchmark: throughput with 1, 2, 4 transfer nodes."""

from __future__ import annotations

from typing import Any

from . import plots as figures
from .text import env_line, rate

CASES = {"s3": "S3 → POSIX", "posix": "POSIX → POSIX", "big": "one big object → POSIX"}


def scaleout(result: dict[str, Any], plots: bool) -> list[str]:
    env, goal, rates = result["environment"], result["goal_efficiency"], result["rates"]
    nodes = sorted({n for r in rates.values() for n in r["nodes"]})
    lines = [
        f"## Scale-out: transfer nodes on Dask ({', '.join(map(str, nodes))} nodes)",
        "",
        "`benchmarks/bench_scaleout.py`, on the testbed of `scripts/local-movers`: a Dask",
        "scheduler and N workers (as root), each in a network namespace of its own behind a",
        "veth capped with `tc` (a stand-in for a node's NIC; the cap is a column), mutual TLS.",
        "Each transfer goes through `DaskExecutor` as the daemon submits it: a tree split into",
        "one shard per node (one big file: a byte range per node), each shard's copy in a",
        "child process as the user (`bbuser1`).",
        "*local* is the local executor on the daemon's host (no cap): the reference, and the",
        "limit of this one machine. Page cache dropped before every run; every run's bytes",
        "checked (MD5 against each object's ETag, SHA-256 against the source tree); rounds",
        "rotate the order; best of the rounds. MB = 10⁶ bytes. Efficiency = rate with N",
        f"nodes ÷ (N × the one-node rate); the goal is ≥ {goal} up to the uncapped limit.",
        "*CPU*: the share of the machine's 2 CPUs busy during that run (everyone's: radosgw,",
        "the Dask processes and the copies share them).",
        "",
        "| case | cap (MB/s) | local (MB/s; CPU) | "
        + " | ".join(f"{n} node{'s' * (n > 1)} (MB/s; efficiency; CPU)" for n in nodes)
        + " |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in nodes) + " |",
    ]
    for case, label in CASES.items():
        for cap in sorted(rates, key=int):
            if case in rates[cap]["summary"]:
                lines.append(_row(label, cap, rates[cap]["summary"][case], nodes))
    lines += [
        "",
        "Data: " + "; ".join(f"{CASES[c]}: {d}" for c, d in result["datasets"].items()) + ".",
        "",
    ]
    if result.get("notes"):
        lines += [result["notes"], ""]
    plt = figures.pyplot(plots)
    if plt is not None:
        path = _plot(plt, rates, nodes)
        lines += [figures.link(path, "scale-out throughput"), ""]
    lines += [env_line(env), ""]
    return lines


def _row(label: str, cap: str, summary: dict[str, Any], nodes: list[int]) -> str:
    """A table row: one case at one cap."""
    best, eff = summary["best_mb_s"], summary["efficiency"]
    cpu = {v: f"; {c:.0%}" for v, c in summary.get("cpu_busy", {}).items()}
    cells = [
        f"{rate(best[str(n)])}; {eff[str(n)]:.2f}{cpu.get(str(n), '')}" if str(n) in best else "—"
        for n in nodes
    ]
    local = f"{rate(best['local'])}{cpu.get('local', '')}" if "local" in best else "—"
    return f"| {label} | {cap} | {local} | " + " | ".join(cells) + " |"


def _plot(plt: Any, rates: dict[str, Any], nodes: list[int]) -> Any:
    """S3 → POSIX MB/s against nodes, a line per cap, with N × cap and the local executor."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    colors = ["tab:blue", "tab:green", "tab:purple", "tab:red"]
    for cap, color in zip(sorted(rates, key=int), colors, strict=False):
        s3 = rates[cap]["summary"].get("s3")
        if s3 is None:
            continue
        best = s3["best_mb_s"]
        ns = [n for n in nodes if str(n) in best]
        ax.plot(ns, [best[str(n)] for n in ns], "o-", color=color, label=f"Dask, {cap} MB/s cap")
        ax.plot(ns, [n * int(cap) for n in ns], "--", color=color, alpha=0.5, label=f"N × {cap}")
        if "local" in best:
            ax.axhline(best["local"], color="gray", ls=":", label=f"local executor ({cap} run)")
    ax.set_xticks(nodes)
    ax.set_xlabel("transfer nodes (Dask workers)")
    ax.set_ylabel("S3 → POSIX, MB/s")
    ax.legend(fontsize="x-small")
    return figures.save(plt, fig, "perf-scaleout.png")
