"""The sections of the staging benchmarks: POSIX (vs cp, rsync) and S3 (vs boto3's
TransferManager, a naive s3fs loop)."""

from __future__ import annotations

from typing import Any

from . import plots as figures
from .text import env_line, rate, size

# -- POSIX throughput ----------------------------------------------------------------------


def posix(result: dict[str, Any], plots: bool) -> list[str]:
    from bbstage.bench import human, plot

    env, cases = result["environment"], result["cases"]
    lines = [
        "## POSIX throughput (vs cp, rsync)",
        "",
        "`benchmarks/bench_posix.py`, through the code of `bbstage bench` (`bbstage/bench/`):",
        "the data set is generated on the local disk, staged by `bbstage.transfer.worker.run` with the",  # noqa: E501
        "daemon's defaults (8 threads per transfer, 64 MiB chunks; the same planning, movers",
        "and atomic temp-file + rename writes as a job), and copied by `cp` / `cp -r` and",
        "`rsync -a` in the same run, each to a fresh destination on the same file system.",
        "Before every copy: previous destination removed, `sync`, the page cache dropped",
        "when permitted (`echo 3 > /proc/sys/vm/drop_caches`, column *cache*), so every",
        "contender reads cold data — otherwise all read it warm — and a wait until no disk",
        "has done I/O for 0.3 s (`/proc/diskstats`). One untimed `cp` first (the first copy",
        "after writing the data ran 2-3x slow, whoever made it). Nobody fsyncs. Medians;",
        "bbstage and `cp` swap places every other run (so each follows the other, and",
        "`rsync`, equally often), `rsync` runs last. MB = 10⁶ bytes.",
        "",
        "How bbstage copies here (both ends on one local ext4 disk): a big file in one",
        "`copy_file_range` stream into a named temporary file renamed into place, as `cp`",
        "and `rsync` do; small files by one copying thread fed by a read-ahead thread",
        "(`POSIX_FADV_WILLNEED` on the next files, a bounded window ahead), each written as an",
        "unnamed `O_TMPFILE` linked into place. On network and parallel file systems the 8",
        "threads copy files (and chunks of big files) concurrently.",
        "",
        "| case | contender | MB/s | files/s | seconds | ours × | cache | runs |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    labels = {"big": "one 4 GiB file", "small": "10,000 × 4 KiB files"}
    for name in ("big", "small"):
        c = cases.get(name)
        if c is None:
            continue
        label = labels[name]
        if c["files"] != (1 if name == "big" else 10_000) or (
            name == "big" and c["total_bytes"] != 4 << 30
        ):
            label = f"{c['files']} × {human(c['file_size'])}"
        lines.append(
            f"| {label} | **bbstage** | {c['mb_per_s']:.1f} | {rate(c['files_per_s'])} | "
            f"{c['seconds']:.3f} | | {c['cache']} | {len(c['runs'])} |"
        )
        for b in c["baselines"].values():
            lines.append(
                f"| {label} | {b['command']} | {b['mb_per_s']:.1f} | {rate(b['files_per_s'])} | "
                f"{b['seconds']:.3f} | {b['ratio']:.2f}× | {c['cache']} | {len(b['runs'])} |"
            )
    lines += ["", "Goals (ours × = baseline's time / ours, medians):", ""]
    for name in ("big", "small"):
        c = cases.get(name)
        if c is None:
            continue
        g = c["goal"]
        lat = c.get("latency_ms") or {}
        lines.append(
            f"* {labels[name]}: {g['metric'].replace('_per_s', '/s').replace('mb', 'MB')} "
            f"vs `{c['baselines'][g['baseline']]['command']}` **{g['ratio']:.2f}×** (goal ≥ "
            f"{g['min_ratio']}×) — {'met' if g['met'] else 'NOT met'}. Per-file latency "
            f"(start to rename) p50 {lat.get('p50', 0):.2f} ms, p99 {lat.get('p99', 0):.2f} ms."
        )
        spread = "; ".join(
            f"{n} " + " ".join(f"{r['seconds']:.2f}" for r in runs)
            for n, runs in [("bbstage", c["runs"])]
            + [(b["command"], b["runs"]) for b in c["baselines"].values()]
        )
        lines.append(f"  Every run (s): {spread}.")
    load = env.get("load_average")
    if load:
        lines += [
            "",
            f"Load average when the benchmark ended: {load[0]:.1f} (1 min), {load[2]:.1f} "
            "(15 min) on 2 CPUs — other work shared the machine and its disk, so single runs",
            "spread widely; compare the ratios, and re-run on a quiet machine for absolute",
            "numbers.",
        ]
    lines.append("")
    plt = figures.pyplot(plots)
    if plt is not None:
        for name in ("big", "small"):
            c = cases.get(name)
            if c is None or not c.get("samples"):
                continue
            path = figures.image(f"perf-posix-{name}.png")
            plot(c, str(path), title=f"{labels[name]}: throughput over time (median run)")
            lines += [figures.link(path, f"{labels[name]} throughput over time"), ""]
    tools = env.get("tools", {})
    lines += [
        env_line(
            env,
            f"{env.get('filesystem', '?')} on a virtio disk",
            "; ".join(tools.values()),
        ),
        "",
    ]
    return lines


# -- S3 ------------------------------------------------------------------------------------


def s3(result: dict[str, Any], plots: bool) -> list[str]:
    r, goals = result["results"], result.get("goals", {})
    lines = [
        "## S3 staging (vs boto3 TransferManager, naive s3fs loop)",
        "",
        "`benchmarks/bench_s3.py` (see its docstring): against the Ceph RGW of",
        "`scripts/local-s3` on 127.0.0.1, as bbuser1; *bbstage* runs each copy as the daemon",
        "does (its `TransferExecutor`: a worker process, as bbuser1) with the `[s3]` defaults,",
        "*transfermanager* boto3's `s3transfer.TransferManager` with its",
        "defaults, *naive* one s3fs call per file. Medians of "
        f"{result.get('rounds', '?')} rounds, contenders in rotating order. MB = 10⁶ bytes.",
        "",
        "| case | contender | MB/s | files/s | seconds | ours × |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for case, c in r.items():
        label = f"{case.replace('_', ' ')} ({c['files']} × {size(c['bytes'] // c['files'])})"
        for who, med in c["median_s"].items():
            ratio = (
                "" if who == "bbstage" else f"{c['median_s'][who] / c['median_s']['bbstage']:.2f}×"
            )
            name = {"bbstage": "**bbstage**", "nowrite": "*nowrite (ceiling)*"}.get(who, who)
            lines.append(
                f"| {label} | {name} | {c['MBps'][who]:.1f} | {c['files_per_s'][who]:.1f} | "
                f"{med:.2f} | {ratio} |"
            )
    lines += ["", "Goals (ours × = contender's time / ours):", ""]
    naive = goals.get("small_vs_naive")
    peers = {"s5cmd": "s5cmd", "rclone": "rclone", "transfermanager": "TransferManager"}
    for case, c in r.items():
        parts = []
        for who, label in peers.items():
            if f"ratio_vs_{who}" not in c:
                continue
            x, goal = c[f"ratio_vs_{who}"], goals.get(f"vs_{who}")
            part = f"**{shown(x, goal)}×** {label}"
            if goal is not None:
                part += f" (goal ≥ {goal}×: {'met' if x >= goal else 'NOT met'})"
            parts.append(part)
        line = f"* {case.replace('_', ' ')}: " + "; ".join(parts)
        if case.startswith("small") and naive is not None and "ratio_vs_naive" in c:
            y = c["ratio_vs_naive"]
            verdict = "met" if y >= naive else "NOT met"
            line += f"; **{shown(y, naive)}×** naive (goal ≥ {naive}×: {verdict})"
        lines.append(line + ".")
        if "nowrite" in c["median_s"]:
            lines.append(_ceiling(c))
    plt = figures.pyplot(plots)
    if plt is not None and r:
        alt = "S3: each contender's time / bbstage's"
        lines += ["", figures.link(_s3_plot(plt, r, goals), alt)]
    host, versions = result.get("host", {}), result.get("versions", {})
    load = result.get("load_average")
    lines += [
        "",
        f"Measured {result.get('date', '?')}, {host.get('cpus', '?')} CPUs, Python "
        f"{host.get('python', '?')}, "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + (f"; load average at the end {load[0]:.1f}" if load else "")
        + ".",
        "",
    ]
    return lines


def shown(ratio: float, goal: float | None) -> str:
    """``ratio`` to two decimals, or three where two would round a miss up onto the goal
    (1.098 is "1.098", not "1.10 ... NOT met")."""
    two = f"{ratio:.2f}"
    return f"{ratio:.3f}" if goal is not None and ratio < goal <= float(two) else two


def _ceiling(c: dict[str, Any]) -> str:
    """What the store allows in a case with a ``nowrite`` run: each peer's time over the time
    of a client that reads every byte and writes none, the most any client could lead by."""
    med = c["median_s"]
    bounds = ", ".join(
        f"{who} {med[who] / med['nowrite']:.2f}×" for who in ("s5cmd", "rclone") if who in med
    )
    return (
        f"  The store's ceiling here: *nowrite* (bbstage's ranged GETs, read and thrown away)"
        f" took {med['nowrite']:.2f} s, bbstage {med['bbstage'] - med['nowrite']:.2f} s more"
        f" to also write the file; no client that writes it can lead by more than {bounds}."
    )


def _s3_plot(plt: Any, r: dict[str, Any], goals: dict[str, Any]) -> Any:
    """Each contender's median time over bbstage's, per case (above 1: bbstage faster), with
    the peers' goal as a line."""
    cases = list(r)
    who = [w for w in r[cases[0]]["median_s"] if w not in ("bbstage", "nowrite")]
    colors = ["tab:orange", "tab:green", "tab:purple", "tab:gray", "tab:brown"]
    series = [
        (w, color, [r[c]["median_s"].get(w, 0) / r[c]["median_s"]["bbstage"] for c in cases])
        for w, color in zip(who, colors, strict=False)
    ]
    goal = goals.get("vs_s5cmd")
    return figures.grouped_bars(
        plt,
        "perf-s3.png",
        [c.replace("_", "\n") for c in cases],
        series,
        ylabel="contender's time / bbstage's",
        figsize=(7.0, 3.6),
        line=(goal, f"goal for s5cmd, rclone: {goal}×") if goal else None,
    )
