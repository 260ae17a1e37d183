"""The sections of the Slurm job array benchmark, one per task count: the hooks' overhead
per task, failed and held tasks, and the daemon's RSS as the tasks complete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import plots as figures
from .text import env_line

REFERENCE = 200  # a larger array's overhead per task must not exceed this one's (goal 3)
VARIANTS = (("noop", "no-op burst_buffer.lua"), ("bbstage", "bbstage hooks + daemon"))


def job_array(result: dict[str, Any], plots: bool) -> list[str]:
    """A section per task count (its title stays when another count is added); the RSS
    figure of every sampled count in the largest one's section."""
    cases = sorted(result["cases"].values(), key=lambda c: c["tasks"])
    sampled = [c for c in cases if _rss_runs(c)]
    plt = figures.pyplot(plots)
    lines: list[str] = []
    for case in cases:
        lines += _section(result, case, first=case is cases[0], plt=plt)
        if plt is not None and sampled and case is sampled[-1]:
            path = _rss_plot(plt, sampled, result["rss_flat_max"])
            lines += [figures.link(path, "bbstage daemon RSS against tasks completed"), ""]
        lines += [env_line(case["environment"], case["environment"].get("slurm", "")), ""]
    return lines


def _section(result: dict[str, Any], case: dict[str, Any], first: bool, plt: Any) -> list[str]:
    """One task count's section, up to its figures (the machine line follows)."""
    n = case["tasks"]
    lines = [f"## Slurm job array overhead ({n:,} tasks)", ""]
    lines += _intro(result, n) if first else [f"The same benchmark with {n:,} tasks.", ""]
    lines += [
        "| variant | hook time per task (ms) | makespan (s) | makespan per task (ms) "
        "| failed / held | runs |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, label in VARIANTS:
        v = case["variants"][key]
        hook = v.get("hook_ms_per_task")
        bad = " / ".join(
            "—" if any(k not in r for r in v["runs"]) else str(sum(r[k] for r in v["runs"]))
            for k in ("failed", "held")
        )
        lines.append(
            f"| {label} | {'—' if hook is None else f'{hook:.2f}'} | {v['seconds']:.2f} | "
            f"{v['seconds'] * 1e3 / n:.1f} | {bad} | {len(v['runs'])} |"
        )
    o = case["overhead_ms_per_task"]
    goal = result["goal_ms_per_task"]
    lines += [
        "",
        f"Overhead: **{o:.2f} ms of hook time per task** (goal < {goal} ms) — "
        f"{'met' if o < goal else 'NOT met'}.",
    ]
    reference = result["cases"].get(str(REFERENCE))
    if reference and n > REFERENCE:
        ref = reference["overhead_ms_per_task"]
        lines.append(
            f"Against {REFERENCE} tasks ({ref:.2f} ms): {o - ref:+.2f} ms per task — "
            f"{'not more, met' if o <= ref else 'more, NOT met'} (goal: no more than at "
            f"{REFERENCE} tasks)."
        )
    walls = ", ".join(
        f"{key} " + " / ".join(f"{r['seconds']:.1f}" for r in case["variants"][key]["runs"])
        for key in ("bbstage", "noop")
    )
    lines.append(
        f"Makespan difference: {case['makespan_ms_per_task']:+.1f} ms per task (runs, s: {walls})."
    )
    failed, held = case["failed"], case["held"]
    lines.append(
        f"Tasks failed or held under bbstage: {failed} failed, {held} held (goal: none) — "
        f"{'met' if failed == held == 0 else 'NOT met'}."
    )
    lines += _rss_lines(case, result["rss_flat_max"])
    hooks = case["variants"]["bbstage"].get("hook_ms")
    if hooks:
        lines += [
            "",
            "bbstage's hooks, median per task (ms): "
            + ", ".join(f"`{k.removeprefix('slurm_bb_')}` {v:.2f}" for k, v in hooks.items())
            + ".",
        ]
    lines.append("")
    for notes in (case.get("notes"), result.get("notes") if first else None):
        if notes:
            lines += [notes, ""]
    if plt is not None:
        path = figures.hbars(
            plt,
            f"perf-job-array-{n}.png",
            ["no-op hooks", "bbstage"],
            [case["variants"][k]["seconds"] for k in ("noop", "bbstage")],
            color=["tab:gray", "tab:blue"],
            xlabel=f"seconds until all {n:,} tasks completed",
            figsize=(7, 2.2),
        )
        lines += [figures.link(path, f"job array wall time, {n:,} tasks"), ""]
    return lines


def _intro(result: dict[str, Any], n: int) -> list[str]:
    """What the benchmark does: written once, in the first (smallest) task count's section."""
    start, flat = result["rss_from_task"], result["rss_flat_max"]
    return [
        "`benchmarks/bench_job_array.py`, on the local Slurm 22.05 cluster",
        f"(`scripts/local-cluster`, one node, 2 CPUs): a job array of {n} tasks, each with one",
        "`#BB_LUA stage_in` and one `stage_out` of a small file, submitted as `bbuser1`. The",
        "baseline is the same array, same `#BB_LUA` lines, under a no-op `burst_buffer.lua`",
        "(every hook returns `slurm.SUCCESS` at once); the variants alternate. Both run",
        "behind a timing shim that logs each asynchronous hook's wall time (as Lua sees it,",
        "inside slurmscriptd's child): a task's **hook time** is the sum over its hooks, and",
        "the overhead per task is bbstage's mean hook time minus the no-op's. The",
        "**makespan** (from `sbatch` until every task is COMPLETED with its burst buffer torn",
        "down) is shown too, but Slurm starts staged tasks on its scheduler cycles",
        "(`bf_interval=1`), so it moves by seconds between identical runs.",
        "",
        "Setup replies before it starts the stage-in, data_in answers from the daemon's",
        "stage-in mark when the copy is done (see [protocol](protocol.md)), and the daemon",
        "runs at `Nice=-10` as `daemon/bbstage.service` has it (the local cluster does the",
        "same): Slurm sets up about ten tasks at once on this 2-CPU machine, and its own",
        "processes compete for the CPU with the daemon's answers.",
        "",
        "A task has **failed** when it ended other than COMPLETED, and is **held** when it",
        "waits at priority 0 (burst_buffer/lua holds a task whose stage-in failed) or with a",
        "`Held` reason. While bbstage's array runs, the daemon's RSS (VmRSS of `bbstage",
        "daemon`, MB = 10⁶ bytes) is read about once a second, with the tasks done so far,",
        "from the polling that waits for the array (no extra Slurm call); it is **flat** when",
        f"its value at the end is at most {flat}× its value at task {start} (issue [N], goal",
        f"3: 1,000 tasks, none failed or held, overhead per task no more than at {REFERENCE}",
        "tasks, RSS flat). A larger array's section compares its overhead with",
        f"{REFERENCE} tasks'.",
        "",
    ]


def _rss_runs(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The RSS samples of bbstage's runs that have them."""
    return [r["rss"] for r in case["variants"]["bbstage"]["runs"] if r.get("rss", {}).get("series")]


def _rss_lines(case: dict[str, Any], flat: float) -> list[str]:
    """The daemon's RSS at the first task judged and at the end, per run: flat or not."""
    runs = _rss_runs(case)
    if not runs:
        return ["Daemon RSS: not sampled in this run."]
    lines = []
    for k, rss in enumerate(runs):
        which = f" (run {k + 1})" if len(runs) > 1 else ""
        if "growth" not in rss:
            lines.append(f"Daemon RSS{which}: too few samples to judge.")
            continue
        restarted = (
            f" The daemon restarted during the run (pids {', '.join(map(str, rss['pids']))})."
            if len(rss.get("pids", [])) > 1
            else ""
        )
        lines.append(
            f"Daemon RSS{which}: {rss['at_from_mb']:.1f} MB at task {rss['from_task']:,}, "
            f"{rss['end_mb']:.1f} MB at the end (peak {rss['max_mb']:.1f} MB in between): "
            f"**{rss['growth']:.2f}×** — {'flat' if rss['growth'] <= flat else 'NOT flat'} "
            f"(flat: ≤ {flat}×).{restarted}"
        )
    return lines


def _rss_plot(plt: Any, cases: list[dict[str, Any]], flat: float) -> Path:
    """Daemon RSS against tasks completed, a line per run, with each run's flat limit."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    colors = ["tab:blue", "tab:green", "tab:purple", "tab:red", "tab:orange"]
    runs = [(c["tasks"], k, rss) for c in cases for k, rss in enumerate(_rss_runs(c))]
    for (n, k, rss), color in zip(runs, colors * len(runs), strict=False):
        xs, ys = zip(*rss["series"], strict=True)
        again = sum(1 for m, _, _ in runs if m == n) > 1
        ax.plot(xs, ys, color=color, label=f"{n:,} tasks" + (f", run {k + 1}" if again else ""))
        if "growth" in rss:
            ax.hlines(
                flat * rss["at_from_mb"], rss["from_task"], n, colors=color, linestyles="--",
                alpha=0.6, label=f"{flat}× RSS at task {rss['from_task']:,}",
            )  # fmt: skip
    ax.set_ylim(0, ax.get_ylim()[1] * 1.1)  # room for the limit's line
    ax.set_xlabel("array tasks completed")
    ax.set_ylabel("bbstage daemon RSS (MB)")
    ax.legend(fontsize="small", loc="lower right")
    return figures.save(plt, fig, "perf-job-array-rss.png")
