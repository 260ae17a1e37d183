"""The leftover sweep of a job the daemon does not know (audit #13): it removes the job
owner's temporary files only (the uid the 24.05+ hooks send; without it, a sole owner's),
and runs at most once per job every ``SWEEP_EVERY`` s however often Slurm polls."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bbstage.daemon import leftovers
from bbstage.daemon.engine import Engine
from tests.unit.test_engine import GID, UID, ask, engine, script

__all__ = ["engine"]  # the fixture

OTHER = 2  # bin: another non-root user


def part(dest: Path, name: str, job_id: str, uid: int) -> Path:
    path = dest / f".{name}.bbstage-{job_id}-0123abcd.part"
    path.write_bytes(b"partial")
    os.chown(path, uid, uid)
    return path


def shared(area: Path) -> tuple[Path, Path]:
    """A destination directory both users may write, and a script staging into it."""
    dest = area / "shared"
    dest.mkdir()
    dest.chmod(0o777)
    job = area / "script"
    job.write_text(script(f"stage_in source=/data/a.bin destination={dest}/a.bin"))
    return dest, job


def test_only_the_job_owners_files_are_removed(engine: Engine, area: Path) -> None:
    """Another user's in-flight file of the same job id (another cluster's job 30 on a
    shared file system) stays: the 24.05+ hooks say whose job this is."""
    dest, job = shared(area)
    mine, theirs = part(dest, "a.bin", "30", UID), part(dest, "b.bin", "30", OTHER)
    ask(engine, "teardown", job_id="30", hurry=True, uid=UID, gid=GID, script_path=str(job))
    assert not mine.exists()
    assert theirs.read_bytes() == b"partial"


def test_without_the_owner_several_owners_files_all_stay(engine: Engine, area: Path) -> None:
    """Slurm 22.05's data_in carries no uid: which owner is the job's cannot be told."""
    dest, job = shared(area)
    first, second = part(dest, "a.bin", "31", UID), part(dest, "b.bin", "31", OTHER)
    ask(engine, "test_data_in", job_id="31", script_path=str(job))
    assert first.exists() and second.exists()
    second.unlink()
    ask(engine, "teardown", job_id="31", hurry=True, script_path=str(job))
    assert first.exists()  # swept less than SWEEP_EVERY s ago: not again
    engine.cleanup.sweeps = leftovers.Pace()
    ask(engine, "teardown", job_id="31", hurry=True, script_path=str(job))
    assert not first.exists()  # a sole owner's: removed


def test_a_job_is_swept_at_most_once_per_sweep_every(
    engine: Engine, area: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every poll of test_data_in for an unknown job would read the script's directories."""
    dest, job = shared(area)
    reads: list[str] = []
    real = leftovers.find

    def counted(where: list[tuple[str, bool]], job_id: str, limit: int = 0) -> dict[int, list[str]]:
        reads.append(job_id)
        return real(where, job_id)

    monkeypatch.setattr(leftovers, "find", counted)
    for _ in range(5):
        ask(engine, "test_data_in", job_id="32", uid=UID, gid=GID, script_path=str(job))
    ask(engine, "test_data_in", job_id="33", uid=UID, gid=GID, script_path=str(job))
    assert reads == ["32", "33"]
    late = part(dest, "a.bin", "32", UID)
    engine.cleanup.sweeps = leftovers.Pace()  # as SWEEP_EVERY s later
    ask(engine, "test_data_in", job_id="32", uid=UID, gid=GID, script_path=str(job))
    assert not late.exists() and reads == ["32", "33", "32"]
