"""[G] Faults on the real cluster: many jobs survive a daemon crash and a slurmctld restart."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

from .conftest import Cluster, as_user

pytestmark = pytest.mark.cluster


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def submit_many(cluster: Cluster, workdir: Path, jobs: int, files: int) -> list[tuple[str, Path]]:
    src = workdir / "src"
    src.mkdir()
    for i in range(files):
        (src / f"f{i:03}").write_bytes(os.urandom(512 << 10))
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


def wait_until(pred, timeout: float) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def check_all(cluster: Cluster, workdir: Path, jobs: list[tuple[str, Path]], files: int) -> None:
    src = workdir / "src"
    digests = {p.name: sha(p) for p in src.iterdir()}
    for job, dst in jobs:
        cluster.wait_gone(job, timeout=300)
        assert cluster.job(job)["JobState"] == "COMPLETED", job
        assert {p.name: sha(p) for p in dst.iterdir()} == digests, job
    for n in range(len(jobs)):
        assert (workdir / f"count{n:02}").read_text().strip() == str(files)


def test_kill_9_daemon_during_50_stage_ins(cluster: Cluster, workdir: Path) -> None:
    jobs = submit_many(cluster, workdir, 50, 12)
    wait_until(lambda: staged_files(workdir) >= 60, 120)
    os.kill(cluster.daemon_pid(), signal.SIGKILL)
    time.sleep(0.5)
    cluster.up()
    check_all(cluster, workdir, jobs, 12)


def test_slurmctld_restart_during_stage_in(cluster: Cluster, workdir: Path) -> None:
    jobs = submit_many(cluster, workdir, 10, 40)
    wait_until(lambda: staged_files(workdir) >= 20, 120)
    pid = int((cluster.dir / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 60)
    cluster.up()
    check_all(cluster, workdir, jobs, 40)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
