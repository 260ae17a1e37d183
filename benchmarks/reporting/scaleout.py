"""The section of the scale-out benchmark: throughput with 1, 2, 4 transfer nodes."""

from __future__ import annotations

from typing import Any

from . import plots as figures
from .text import env_line, rate

CASES = {"s3": "S3 → POSIX", "posix": "POSIX → POSIX"}


def scaleout(result: dict[str, Any], plots: bool) -> list[str]:
    env, nodes, cap = result["environment"], result["nodes"], result["rate_mb_s"]
    goal = result["goal_efficiency"]
    lines = [
        f"## Scale-out: transfer nodes on Dask ({', '.join(map(str, nodes))} nodes)",
        "",
        "`benchmarks/bench_scaleout.py`, on the testbed of `scripts/local-movers`: a Dask",
        "scheduler and N workers (as root), each in a network namespace of its own behind a",
        f"veth capped at **{cap} MB/s** with `tc` (a stand-in for a node's NIC), mutual TLS.",
        "Each transfer goes through `DaskExecutor` as the daemon submits it: a tree split into",
        "one shard per node, each shard's copy in a child process as the user (`bbuser1`).",
        "*local* is the local executor on the daemon's host (no cap): the reference, and the",
        "limit of this one machine. Page cache dropped before every run; every run's bytes",
        "checked (MD5 against each object's ETag, SHA-256 against the source tree); rounds",
        "rotate the order; best of the rounds. MB = 10⁶ bytes. Efficiency = rate with N",
        f"nodes ÷ (N × the one-node rate); the goal is ≥ {goal} up to the uncapped limit.",
        "",
        "| case | data | local (MB/s) | "
        + " | ".join(f"{n} node{'s' * (n > 1)} (MB/s, efficiency)" for n in nodes)
        + " |",
        "| --- | --- | ---: | " + " | ".join("---:" for _ in nodes) + " |",
    ]
    summary = result["summary"]
    for case, label in CASES.items():
        if case not in summary:
            continue
        best, eff = summary[case]["best_mb_s"], summary[case]["efficiency"]
        cells = [
            f"{rate(best[str(n)])} ({eff[str(n)]:.2f})" if str(n) in best else "—" for n in nodes
        ]
        local = rate(best["local"]) if "local" in best else "—"
        lines.append(
            f"| {label} | {result['datasets'][case]} | {local} | " + " | ".join(cells) + " |"
        )
    lines.append("")
    if result.get("notes"):
        lines += [result["notes"], ""]
    plt = figures.pyplot(plots)
    if plt is not None:
        path = _plot(plt, summary, nodes, cap)
        lines += [figures.link(path, "scale-out throughput"), ""]
    lines += [env_line(env), ""]
    return lines


def _plot(plt: Any, summary: dict[str, Any], nodes: list[int], cap: int) -> Any:
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for (case, label), color in zip(CASES.items(), ("tab:blue", "tab:orange"), strict=True):
        if case not in summary:
            continue
        best = summary[case]["best_mb_s"]
        ns = [n for n in nodes if str(n) in best]
        ax.plot(ns, [best[str(n)] for n in ns], "o-", color=color, label=f"{label} (Dask)")
        if "local" in best:
            ax.axhline(best["local"], color=color, ls=":", label=f"{label}, local executor")
    ax.plot(nodes, [n * cap for n in nodes], "--", color="gray", label=f"N × {cap} MB/s cap")
    ax.set_xticks(nodes)
    ax.set_xlabel("transfer nodes (Dask workers)")
    ax.set_ylabel("MB/s")
    ax.legend(fontsize="small")
    return figures.save(plt, fig, "perf-scaleout.png")
