"""benchmarks/bench_s3.py's top level stays light where bbstage's worker processes re-run it.

Python 3.11's forkserver re-runs the main script's top level in every worker it forks, as
``__mp_main__`` (bbstage/daemon/executor.py). The daemon's is its console script; the benchmark's
must cost its workers no more, or every copy of bbstage that gets a fresh worker is timed
with the benchmark's own imports (pytest, rich) read from a dropped page cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Imported by the benchmark's top level, by no worker of the daemon
HEAVY = ["bbstage.bench", "boto3", "pytest", "rich", "tests.s3env"]


def imported_by_running(run_name: str) -> list[str]:
    """The heavy modules loaded by running bench_s3.py's top level as ``run_name``, as
    multiprocessing's ``_fixup_main_from_path`` runs it."""
    code = (
        "import runpy, sys\n"
        "sys.path.insert(0, 'benchmarks')\n"
        f"runpy.run_path('benchmarks/bench_s3.py', run_name={run_name!r})\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_a_worker_re_running_the_benchmark_imports_nothing_heavy() -> None:
    assert imported_by_running("__mp_main__") == []


def test_the_benchmark_itself_still_imports_them() -> None:
    """The check above can see them: run as any other name, the top level imports them."""
    assert imported_by_running("bench_s3") == HEAVY
