"""benchmarks/bench_job_array.py's bookkeeping (task states, the daemon's RSS) and its
report section, without a cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_job_array as bench  # noqa: E402  (benchmarks/ is not a package)
from reporting.job_array import job_array  # noqa: E402

SCONTROL = """\
JobId=11 ArrayJobId=10 ArrayTaskId=1 Priority=4294901759 JobState=COMPLETED Reason=None BurstBufferState=complete
JobId=12 ArrayJobId=10 ArrayTaskId=2 Priority=4294901758 JobState=COMPLETED Reason=None BurstBufferState=teardown
JobId=13 ArrayJobId=10 ArrayTaskId=3 Priority=4294901757 JobState=FAILED Reason=NonZeroExitCode BurstBufferState=complete
JobId=14 ArrayJobId=10 ArrayTaskId=4 Priority=0 JobState=PENDING Reason=burst_buffer/lua:_slurm_bb_data_in:_error BurstBufferState=complete
JobId=15 ArrayJobId=10 ArrayTaskId=5 Priority=4294901755 JobState=PENDING Reason=JobHeldUser BurstBufferState=pending
JobId=10 ArrayJobId=10 ArrayTaskId=6-9%4 Priority=4294901754 JobState=PENDING Reason=BurstBufferResources
"""  # noqa: E501


def test_task_ids_of_single_tasks_ranges_and_a_throttled_remainder() -> None:
    assert bench.task_ids("7") == [7]
    assert bench.task_ids("5-8%10") == [5, 6, 7, 8]
    assert bench.task_ids("3,5-6") == [3, 5, 6]


def test_outcomes_sort_the_tasks_by_state(monkeypatch: pytest.MonkeyPatch) -> None:
    def scontrol(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, SCONTROL, "")

    monkeypatch.setattr(bench.subprocess, "run", scontrol)
    assert bench.outcomes("10") == {
        "done": {1},
        "failed": {3},
        "held": {4, 5},
        "active": {2, 6, 7, 8, 9},
    }


def test_rss_summary_from_task_100_to_the_end() -> None:
    series = [[0, 40.0], [50, 41.0], [101, 42.0], [600, 47.0], [1000, 44.1]]
    assert bench.rss_summary(series, 1000) == {
        "from_task": 101,
        "at_from_mb": 42.0,
        "end_mb": 44.1,
        "max_mb": 47.0,
        "growth": pytest.approx(1.05),
    }
    assert bench.rss_summary(series, 20)["from_task"] == 50  # half-way: no task 100
    assert bench.rss_summary([[0, 40.0]], 1000) == {}


def case(tasks: int, overhead: float, rss: dict[str, Any] | None) -> dict[str, Any]:
    run = {"seconds": tasks * 0.5, "failed": 0, "held": 1 if rss else 0}
    variant = {"seconds": tasks * 0.5, "hook_ms_per_task": overhead, "runs": [run]}
    if rss:
        run["rss"] = rss
    return {
        "tasks": tasks,
        "variants": {"bbstage": variant, "noop": {**variant, "hook_ms_per_task": 0.1}},
        "overhead_ms_per_task": overhead - 0.1,
        "makespan_ms_per_task": 0.0,
        "failed": 0,
        "held": run["held"],
        "environment": {"date": "today"},
    }


def test_the_report_has_a_section_per_task_count_and_judges_the_goal() -> None:
    rss = {
        "from_task": 101,
        "at_from_mb": 40.0,
        "end_mb": 46.0,
        "max_mb": 46.0,
        "growth": 1.15,
        "pids": [7],
        "series": [[0, 39.0], [101, 40.0], [1000, 46.0]],
    }
    result = {
        "goal_ms_per_task": 25.0,
        "rss_from_task": 100,
        "rss_flat_max": 1.1,
        "cases": {"1000": case(1000, 30.0, rss), "200": case(200, 36.0, None)},
    }
    text = "\n".join(job_array(result, plots=False))
    assert text.index("## Slurm job array overhead (200 tasks)") < text.index(
        "## Slurm job array overhead (1,000 tasks)"
    )
    assert "Daemon RSS: not sampled in this run." in text
    assert "Against 200 tasks (35.90 ms): -6.00 ms per task — not more, met" in text
    assert "0 failed, 1 held (goal: none) — NOT met" in text
    assert "40.0 MB at task 101, 46.0 MB at the end" in text
    assert "**1.15×** — NOT flat (flat: ≤ 1.1×)" in text
