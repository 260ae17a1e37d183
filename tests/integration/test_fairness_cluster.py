"""Many users on the real cluster: one user's stalled copies do not hold another user's job
(issue #36). SIGSTOP of bbuser1's copy processes stands in for a hung server."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.campaign import worker_pids
from tests.helpers import file_digest, wait_until

from .conftest import OTHER, USER, Cluster, as_user

pytestmark = pytest.mark.cluster


def test_a_stopped_users_copies_do_not_hold_another_users_small_job(
    cluster: Cluster, workdir: Path
) -> None:
    """bbuser1's job stages six big files; once its copies run they are SIGSTOPped (they
    hold every slot and never end). bbuser2's job staging 1 MiB must be COMPLETED within
    30 s, its file byte for byte, long before the watchdog (stall_timeout, 300 s) fires."""
    big = workdir / "big"
    with open(big, "wb") as f:
        f.truncate(8 << 30)  # sparse: its copy takes seconds, its source no disk
    lines = [f"#BB_LUA stage_in source={big} destination={workdir}/out{i}" for i in range(6)]
    as_user(workdir)
    heavy = cluster.submit(workdir, "#!/bin/bash\n" + "\n".join(lines) + "\ntrue\n")
    uid = pwd.getpwnam(USER).pw_uid
    stopped: list[int] = []

    def copying() -> list[int]:
        parts = [p for p in workdir.iterdir() if p.name.endswith(".part")]
        pids = [p for p in worker_pids(cluster.daemon_pid()) if os.stat(f"/proc/{p}").st_uid == uid]
        return pids if parts and pids else []

    light_dir = workdir / "light"
    light_dir.mkdir()
    workdir.chmod(0o755)
    data = os.urandom(1 << 20)
    (light_dir / "in").write_bytes(data)
    as_user(light_dir, OTHER)
    try:
        for pid in wait_until(copying, 60, "bbuser1's copies under way"):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        time.sleep(2)  # every slot that bbuser1 can take, taken and stopped
        body = (
            f"#!/bin/bash\n#BB_LUA stage_in source={light_dir}/in destination={light_dir}/out\n"
            f"cat {light_dir}/out > /dev/null\n"
        )
        asked = time.monotonic()
        light = cluster.submit(light_dir, body, user=OTHER)
        info = cluster.wait_state(light, "COMPLETED", "FAILED", "CANCELLED", timeout=30)
        took = time.monotonic() - asked
        assert info["JobState"] == "COMPLETED", info
        assert file_digest(light_dir / "out") == file_digest(light_dir / "in")
        assert took < 30, f"bbuser2's job took {took:.0f} s behind bbuser1's stopped copies"
        assert cluster.job(heavy).get("JobState") == "PENDING"  # still held by its stage-in
    finally:
        cluster.run("scancel", heavy, check=False)
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        cluster.wait_gone(heavy, timeout=120)
        shutil.rmtree(light_dir, ignore_errors=True)
