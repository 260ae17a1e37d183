"""[G] Faults on the real cluster: many jobs survive a daemon crash and a slurmctld restart;
a job Slurm strands in stage-in ends clearly (cancelled, with the reason) instead of waiting."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
from pathlib import Path

import pytest

from tests.campaign import worker_pids
from tests.helpers import (
    file_digest,
    kill_with_a_temporary_file,
    make_tree,
    process_gone,
    wait_until,
)

from .conftest import NEWEST, REPO, USER, Cluster, as_user

pytestmark = pytest.mark.cluster


def submit_many(cluster: Cluster, workdir: Path, jobs: int, files: int) -> list[tuple[str, Path]]:
    src = make_tree(workdir / "src", files, 512 << 10, digits=3)
    as_user(workdir)
    out = []
    for n in range(jobs):
        dst = workdir / f"dst{n:02}"
        job = cluster.submit(
            workdir,
            f"#!/bin/bash\n#BB_LUA stage_in source={src}/ destination={dst}/\n"
            f"ls {dst} | wc -l > {workdir}/count{n:02}\n",
        )
        out.append((job, dst))
    return out


def staged_files(workdir: Path) -> int:
    return sum(len(os.listdir(p)) for p in workdir.glob("dst*") if p.is_dir())


STRANDED = "Slurm lost this job's stage-in"


def check_all(
    cluster: Cluster,
    workdir: Path,
    jobs: list[tuple[str, Path]],
    files: int,
    *,
    stranded_ok: bool = False,
) -> None:
    """Every job COMPLETED with every byte of its inputs. With ``stranded_ok``, a job may
    instead have been stranded by Slurm and cancelled by the daemon, saying so (reconcile)."""
    src = workdir / "src"
    digests = {p.name: file_digest(p) for p in src.iterdir()}
    for n, (job, dst) in enumerate(jobs):
        cluster.wait_gone(job, timeout=300)
        if stranded_ok and cluster.job(job)["JobState"] == "CANCELLED":
            assert STRANDED in cluster.status(job)["error"], job
            assert not (workdir / f"count{n:02}").exists(), job  # it never ran
            continue
        assert cluster.job(job)["JobState"] == "COMPLETED", job
        assert {p.name: file_digest(p) for p in dst.iterdir()} == digests, job
        assert (workdir / f"count{n:02}").read_text().strip() == str(files)


def stop_slurmctld(cluster: Cluster) -> None:
    pid = int((cluster.dir / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: process_gone(pid), 60, f"slurmctld (pid {pid}) to end")


def test_kill_9_daemon_during_50_stage_ins(cluster: Cluster, workdir: Path) -> None:
    jobs = submit_many(cluster, workdir, 50, 12)
    wait_until(lambda: staged_files(workdir) >= 60, 120, "60 files staged")
    pid = cluster.daemon_pid()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: process_gone(pid), 20, f"the killed daemon (pid {pid}) to end")
    cluster.up()
    check_all(cluster, workdir, jobs, 12)


def test_slurmctld_restart_during_stage_in(cluster: Cluster, workdir: Path) -> None:
    jobs = submit_many(cluster, workdir, 10, 40)
    wait_until(lambda: staged_files(workdir) >= 20, 120, "20 files staged")
    stop_slurmctld(cluster)
    cluster.up()
    # A stage-in hook that slurmctld kills as it stops may be reported as failed (24.11), and
    # the job stranded: see the next test, which makes that happen on purpose.
    check_all(cluster, workdir, jobs, 40, stranded_ok=True)


# 24.05+ only: its state saving (read in 24.11's code, unchanged in 26.05's _recover_job_bb);
# 22.05's data_in is one blocking call. Run on the newest generation.
@pytest.mark.parametrize("cluster", [NEWEST], indirect=True)
def test_a_job_slurm_strands_in_stage_in_is_cancelled_with_the_reason(
    cluster: Cluster, workdir: Path
) -> None:
    # What Slurm 24.11 does in a rare race (bbstage/daemon/reconcile.py), made on purpose: slurmctld
    # stops during a stage-in, the teardown its failed hook causes reaches the daemon, and
    # the job's buffer record is not saved, while the job's record still says staging-in.
    src = make_tree(workdir / "src", 400, 256 << 10, digits=3)
    as_user(workdir)
    job = cluster.submit(
        workdir, f"#!/bin/bash\n#BB_LUA stage_in source={src}/ destination={workdir}/dst/\n"
    )
    cluster.wait(job, lambda j: j.get("BurstBufferState") == "staging-in", 60)
    stop_slurmctld(cluster)
    user = pwd.getpwnam(USER)
    teardown = subprocess.run(
        ["lua5.1", str(REPO / "tests" / "lua" / "call_hook.lua"), str(cluster.dir / "etc"),
         "slurm_bb_job_teardown", job, "nil", "true", str(user.pw_uid), str(user.pw_gid)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert teardown.stdout.startswith("rc=0"), teardown
    for name in ("burst_buffer_lua_state", "burst_buffer_lua_state.old"):
        (cluster.dir / "spool" / "ctld" / name).unlink(missing_ok=True)
    cluster.up()
    # Not wait_gone: cancelling a pending job, 24.11 flushes the job's scripts while it queues
    # its teardown and may kill that teardown ("teardown ... terminated by slurmctld"), which
    # leaves BurstBufferState=teardown until slurmctld restarts. The daemon tore down already.
    cluster.wait_state(job, "CANCELLED", timeout=240)
    assert STRANDED in cluster.status(job)["error"]


def test_a_lost_state_after_a_killed_worker_leaves_no_temporary_file(
    cluster: Cluster, workdir: Path
) -> None:
    """I3, the double fault the campaign found: a worker SIGKILLed, then the daemon, and its
    database lost before the worker's temporary file was removed. The job is unknown after
    the restart; its next hook (22.05: data_in, 24.11: test_data_in) removes the file."""
    src = make_tree(workdir / "src", 24, 32 << 20, digits=3)  # named .part temporary files
    dst = workdir / "dst"
    as_user(workdir)
    # From the disk, not the page cache: in CI's run 24 x 8 MiB in the page cache were
    # staged in 60 ms, before the test saw any temporary file.
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    job = cluster.submit(
        workdir, f"#!/bin/bash\n#BB_LUA stage_in source={src}/ destination={dst}/\ntrue\n"
    )
    daemon = cluster.daemon_pid()
    kill_with_a_temporary_file(dst, lambda: worker_pids(daemon), daemon)
    for db in (cluster.dir / "bbstage").glob("state.db*"):
        db.unlink()
    cluster.up()
    try:
        wait_until(lambda: not temps(dst), 120, "the temporary files to be removed")
    finally:  # the job itself is held or requeued, saying why (docs/reliability.md)
        cluster.run("scancel", job, check=False)
    wait_until(lambda: cluster.job(job).get("JobState") == "CANCELLED", 240, "the cancel")
    assert not temps(dst)


def temps(root: Path) -> list[Path]:
    return list(root.rglob(".*.part"))
