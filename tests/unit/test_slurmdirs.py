"""bbstage.daemon.slurmdirs: the state directory and script Slurm forgets for an array task."""

from __future__ import annotations

from pathlib import Path

import pytest

from bbstage.daemon import slurmdirs
from bbstage.daemon.slurmdirs import mend_task


def state(tmp_path: Path, array: int) -> Path:
    """A StateSaveLocation holding array ``array``'s script; returns the script path Slurm
    hands a task split off it (the task's own, missing one) for task id ``array + 1``."""
    job_dir = tmp_path / f"hash.{array % 10}" / f"job.{array}"
    job_dir.mkdir(parents=True)
    (job_dir / "script").write_bytes(b"#!/bin/bash\n#BB_LUA stage_in ...\n")
    for i in range(10):
        (tmp_path / f"hash.{i}").mkdir(exist_ok=True)
    task = array + 1
    return tmp_path / f"hash.{task % 10}" / f"job.{task}" / "script"


def test_a_split_off_task_gets_its_directory_and_the_arrays_script(tmp_path: Path) -> None:
    given = state(tmp_path, 509)
    assert mend_task("510", "509", str(given), None)
    assert given.parent.stat().st_mode & 0o777 == 0o700
    assert given.read_bytes() == (tmp_path / "hash.9" / "job.509" / "script").read_bytes()
    assert given.stat().st_ino == (tmp_path / "hash.9" / "job.509" / "script").stat().st_ino
    assert not mend_task("510", "509", str(given), None)  # a re-run of setup: nothing to do


def test_a_directory_slurm_made_empty_gets_the_script(tmp_path: Path) -> None:
    given = state(tmp_path, 520)
    given.parent.mkdir()  # Slurm's validate2 of the array record leaves it empty
    assert mend_task("521", "520", str(given), None)
    assert given.exists()


def test_a_memfd_script_path_asks_scontrol_for_the_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = state(tmp_path, 509)
    monkeypatch.setattr(slurmdirs, "_known", {"conf": str(tmp_path)})
    assert mend_task("510", "509", "/proc/123/fd/7", "conf")
    assert given.exists()


def test_not_an_array_task_or_odd_ids_change_nothing(tmp_path: Path) -> None:
    given = state(tmp_path, 509)
    assert not mend_task("509", "509", str(given), None)
    assert not mend_task("../510", "509", str(given), None)
    assert not mend_task("510", "5O9", str(given), None)
    assert not given.parent.exists()


def test_an_unreachable_state_directory_is_only_logged(tmp_path: Path) -> None:
    missing = tmp_path / "hash.0" / "job.510" / "script"  # the daemon runs elsewhere
    assert not mend_task("510", "509", str(missing), None)
