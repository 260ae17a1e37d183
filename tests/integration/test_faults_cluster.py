"""[G] Faults on the real cluster: many jobs survive a daemon crash and a slurmctld restart."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.helpers import file_digest, make_tree, process_gone, wait_until

from .conftest import Cluster, as_user

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


def check_all(cluster: Cluster, workdir: Path, jobs: list[tuple[str, Path]], files: int) -> None:
    src = workdir / "src"
    digests = {p.name: file_digest(p) for p in src.iterdir()}
    for job, dst in jobs:
        cluster.wait_gone(job, timeout=300)
        assert cluster.job(job)["JobState"] == "COMPLETED", job
        assert {p.name: file_digest(p) for p in dst.iterdir()} == digests, job
    for n in range(len(jobs)):
        assert (workdir / f"count{n:02}").read_text().strip() == str(files)


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
    pid = int((cluster.dir / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: process_gone(pid), 60, f"slurmctld (pid {pid}) to end")
    cluster.up()
    check_all(cluster, workdir, jobs, 40)
