"""A reused job id never hands over or deletes another job's kept scratch (audit #2): Slurm's
job ids start again (``slurmctld -c``, a lost StateSaveLocation, MaxJobId wrapping), and the
new job of that id must get a fresh, empty ``$BB_SCRATCH``, never the old one's results."""

from __future__ import annotations

import os
from pathlib import Path

from bbstage.daemon.engine import Engine
from bbstage.movers import TransferError
from bbstage.transfer import Done, Planned
from tests.helpers import digest, file_digest
from tests.unit.test_engine import GID, UID, ask, engine, outcomes, script, setup

__all__ = ["engine"]  # the fixture
OTHER = 1  # daemon: another known non-root user


def kept_of(scratch: Path, job_id: str) -> list[Path]:
    return sorted(p for p in scratch.parent.iterdir() if p.name.startswith(f"{job_id}.kept-"))


def test_a_failed_stage_outs_kept_scratch_is_set_aside_for_the_next_job_of_its_id(
    engine: Engine,
) -> None:
    """User A's stage-out fails: the scratch is kept (finished record). Job ids start again
    and user B's job gets the same id: B gets a fresh, empty directory of its own; A's
    results stay A's, set aside, and B's teardown does not remove them."""
    setup(engine, "20", "stage_out source=$BB_SCRATCH/out.dat destination=/results/out.dat")
    assert ask(engine, "data_in", job_id="20") == ("ok", "")
    assert ask(engine, "pre_run", job_id="20") == ("ok", "")
    old = engine.store.job("20")
    assert old is not None and old.scratch
    results = os.urandom(4096)
    (Path(old.scratch) / "out.dat").write_bytes(results)
    outcomes(engine).append((Planned(4096, 1), TransferError("no space left on device: /r")))
    assert ask(engine, "data_out", job_id="20")[0] == "error"
    assert ask(engine, "teardown", job_id="20", hurry=False)[0] == "ok"
    assert engine.store.job("20").state == "failed"  # type: ignore[union-attr]

    setup(engine, "20", "stage_in source=/x destination=$BB_SCRATCH/x", uid=OTHER)
    new = engine.store.job("20")
    assert new is not None and new.uid == OTHER and new.scratch == old.scratch
    mine = Path(new.scratch)  # type: ignore[arg-type]
    assert os.listdir(mine) == [] and mine.stat().st_uid == OTHER
    [kept] = kept_of(mine, "20")
    assert kept.stat().st_uid == UID and oct(kept.stat().st_mode & 0o777) == oct(0o700)
    assert file_digest(kept / "out.dat") == digest(results)

    assert ask(engine, "teardown", job_id="20", hurry=True)[0] == "ok"
    assert not mine.exists()
    assert file_digest(kept / "out.dat") == digest(results)


def test_an_orphaned_scratch_of_another_user_is_never_adopted(engine: Engine) -> None:
    """A directory left in the pool with no record at all (the state was lost): a new job
    never takes it over, nor does a job recreated after a lost state of another user."""
    setup(engine, "21", "stage_in source=/x destination=/y")
    job = engine.store.job("21")
    assert job is not None and job.scratch
    orphan = Path(job.scratch)
    (orphan / "secret").write_bytes(b"A's")
    engine.store.delete_job("21")  # the record is gone; the directory stays

    lines = ("stage_out source=$BB_SCRATCH/out.dat destination=/results/out.dat",)
    outcomes(engine).append((Planned(0, 0), Done(0, 0)))
    fields = {"job_id": "21", "uid": OTHER, "gid": GID, "script": script(*lines)}
    assert ask(engine, "data_out", **fields)[0] == "ok"  # recreated, as another user
    assert os.listdir(orphan) == [] and orphan.stat().st_uid == OTHER
    [kept] = kept_of(orphan, "21")
    assert (kept / "secret").read_bytes() == b"A's" and kept.stat().st_uid == UID


def test_a_job_recreated_after_a_lost_state_takes_back_its_own_users_scratch(
    engine: Engine,
) -> None:
    setup(engine, "22", "stage_in source=/x destination=/y")
    job = engine.store.job("22")
    assert job is not None and job.scratch
    (Path(job.scratch) / "out.dat").write_bytes(b"results")
    engine.store.delete_job("22")
    lines = ("stage_out source=$BB_SCRATCH/out.dat destination=/results/out.dat",)
    outcomes(engine).append((Planned(7, 1), Done(7, 1)))
    fields = {"job_id": "22", "uid": UID, "gid": GID, "script": script(*lines)}
    assert ask(engine, "data_out", **fields)[0] == "ok"
    assert (Path(job.scratch) / "out.dat").read_bytes() == b"results"
    assert kept_of(Path(job.scratch), "22") == []
