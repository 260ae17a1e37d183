"""The section of the Slurm job array benchmark: the hooks' overhead per task."""

from __future__ import annotations

from typing import Any

from . import plots as figures
from .text import env_line


def job_array(result: dict[str, Any], plots: bool) -> list[str]:
    env = result["environment"]
    n = result["tasks"]
    lines = [
        f"## Slurm job array overhead ({n} tasks)",
        "",
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
        "| variant | hook time per task (ms) | makespan (s) | makespan per task (ms) | runs |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for key, label in (("noop", "no-op burst_buffer.lua"), ("bbstage", "bbstage hooks + daemon")):
        v = result["variants"][key]
        hook = v.get("hook_ms_per_task")
        lines.append(
            f"| {label} | {'—' if hook is None else f'{hook:.2f}'} | {v['seconds']:.2f} | "
            f"{v['seconds'] * 1e3 / n:.1f} | {len(v['runs'])} |"
        )
    o = result["overhead_ms_per_task"]
    goal = result["goal_ms_per_task"]
    lines += [
        "",
        f"Overhead: **{o:.2f} ms of hook time per task** (goal < {goal} ms) — "
        f"{'met' if o < goal else 'NOT met'}.",
    ]
    if "makespan_ms_per_task" in result:
        walls = ", ".join(
            f"{key} " + " / ".join(f"{r['seconds']:.1f}" for r in result["variants"][key]["runs"])
            for key in ("bbstage", "noop")
        )
        lines.append(
            f"Makespan difference: {result['makespan_ms_per_task']:+.1f} ms per task "
            f"(runs, s: {walls})."
        )
    hooks = result["variants"]["bbstage"].get("hook_ms")
    if hooks:
        lines += [
            "",
            "bbstage's hooks, median per task (ms): "
            + ", ".join(f"`{k.removeprefix('slurm_bb_')}` {v:.2f}" for k, v in hooks.items())
            + ".",
        ]
    lines.append("")
    if result.get("notes"):
        lines += [result["notes"], ""]
    plt = figures.pyplot(plots)
    if plt is not None:
        path = figures.hbars(
            plt,
            "perf-job-array.png",
            ["no-op hooks", "bbstage"],
            [result["variants"][k]["seconds"] for k in ("noop", "bbstage")],
            color=["tab:gray", "tab:blue"],
            xlabel=f"seconds until all {n} tasks completed",
            figsize=(7, 2.2),
        )
        lines += [figures.link(path, "job array wall time"), ""]
    lines += [env_line(env, env.get("slurm", "")), ""]
    return lines
