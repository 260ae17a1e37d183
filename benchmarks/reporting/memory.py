"""The section of the memory benchmark: peak RSS and files/s staging million-file trees."""

from __future__ import annotations

from typing import Any

from .text import env_line, rate, size


def memory(result: dict[str, Any], plots: bool) -> list[str]:
    goal, cases = result["goal"], result["cases"]
    counts = sorted(cases, key=int)
    lines = [
        "## Memory: staging trees of many small files",
        "",
        "`benchmarks/bench_memory.py`: a tree of N × 1 KiB files (1,000 per directory) staged",
        "by a real daemon with the real Lua hooks (22.05-style: `setup` starts the copy, a",
        "blocking `data_in` returns at its end), every process under the daemon sampled every",
        "0.05 s (RSS, PSS); `cp -r` of the same tree as the baseline; page cache dropped before",
        "each. *daemon + worker* is the goal's figure, the sum of their RSS (with the",
        "worker's walk process, `bbstage.transfer.walkproc`, when it has one; the forkserver, which",  # noqa: E501
        "only forks workers, and multiprocessing's tracker are in *all*). Goals: daemon +",
        "worker below",
        f"{goal['max_mb']} MB, the largest tree within {goal['max_growth']}× the 100,000-file",
        f"peak, files/s ≥ {goal['min_files_ratio']}× `cp -r`.",
        "",
        "| files | bbstage (s) | files/s | daemon + worker peak (MB) | all (MB RSS / PSS) "
        "| `cp -r` files/s | ratio | `bbstage status` max (s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in counts:
        c = cases[n]
        b, peak = c["bbstage"], c["bbstage"]["peak_mb"]
        lines.append(
            f"| {int(n):,} × {size(c['file_size'])} | {b['seconds']:.1f} | {rate(b['files_per_s'])}"
            f" | {peak['daemon_worker_rss']:.1f} | {peak['all_rss']:.1f} / {peak['all_pss']:.1f}"
            f" | {rate(c['cp']['files_per_s'])} | {c['files_ratio']:.2f}"
            f" | {b['status_s_max']:.2f} |"
        )
    lines.append("")
    top = cases[counts[-1]]
    peak = top["bbstage"]["peak_mb"]["daemon_worker_rss"]
    verdicts = [
        f"peak {peak:.1f} MB < {goal['max_mb']} MB: {'met' if peak < goal['max_mb'] else 'NOT met'}"
    ]
    if "100000" in cases and counts[-1] != "100000":
        growth = peak / cases["100000"]["bbstage"]["peak_mb"]["daemon_worker_rss"]
        ok = growth <= goal["max_growth"]
        verdicts.append(f"growth from 100,000 files {growth:.2f}×: {'met' if ok else 'NOT met'}")
    ratio = top["files_ratio"]
    ok = ratio >= goal["min_files_ratio"]
    verdicts.append(f"files/s {ratio:.2f}× `cp -r`: {'met' if ok else 'NOT met'}")
    lines += [f"At {int(counts[-1]):,} files: " + "; ".join(verdicts) + ".", ""]
    lines += [env_line(result["environment"]), ""]
    return lines
