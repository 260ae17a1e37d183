"""[V] An upgrade under staging jobs, and the way back: the daemon of the previous release
(its wheel built from its tag) stops in the middle of a stage-in and a stage-out, the new
release's daemon starts on the same state and finishes them; then the same from the new
release back to the previous one. Every file hashed; a file that had landed before the switch
is never copied again (its inode is the one it had).

Each switch is what docs/operations.md ("Upgrades") tells an admin: `bbstage drain`, the new
package, the daemon started again. The cluster's daemon runs from a site directory of this
test's own (BBSTAGE_SITE_DIR), so the other generations' daemons are not touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import bbstage
from tests.campaign import worker_pids
from tests.helpers import make_tree, tree_digests, wait_until

from .conftest import REPO, USER, Cluster, as_user, local_cluster_up

# Not in scripts/test (-m "not upgrade") until it is reliable: in CI it failed on both
# generations, its transfers done before a status poll saw them in the middle (the
# previous stop's note); by hand: scripts/test -m upgrade tests/integration/test_upgrade_cluster.py
pytestmark = [pytest.mark.cluster, pytest.mark.upgrade]
SITE = Path("/var/tmp/bbstage-site-upgrade")
WHEELS = Path("/var/tmp/bbstage-previous-release")


def previous_release() -> tuple[str, str]:
    """The previous release's version and commit: its tag, else docs/releasing.md's row (a
    clone without tags)."""
    table = (REPO / "docs" / "releasing.md").read_text()
    rows = re.findall(r"^\| (\d+\.\d+\.\d+) \| `v[^`]+` \| `([0-9a-f]+)` \|$", table, re.M)
    assert rows, "docs/releasing.md names no released version"
    return rows[-1]


def previous_wheel() -> Path:
    """The previous release's wheel, built from its commit once per machine."""
    version, commit = previous_release()
    wheel = WHEELS / f"bbstage-{version}-py3-none-any.whl"
    if wheel.exists():
        return wheel
    src = WHEELS / f"src-{commit}"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit],
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "pip", "wheel", "-q",
                    "--no-deps", "-w", str(WHEELS), str(src)], check=True)  # fmt: skip
    assert wheel.exists(), f"no {wheel} built from {commit}"
    return wheel


def switch(slurm: str, wheel: Path | None) -> Cluster:
    """Bring the cluster up with the site install of ``wheel`` (None: the checkout's)."""
    env = {k: v for k, v in os.environ.items() if k != "BBSTAGE_SITE_WHEEL"}
    env["BBSTAGE_SITE_DIR"] = str(SITE)
    if wheel is not None:
        env["BBSTAGE_SITE_WHEEL"] = str(wheel)
    env = local_cluster_up("--slurm", slurm, env=env)
    return Cluster(env, Path(env["BBSTAGE_CLUSTER_DIR"]), slurm)


def daemon_version(cluster: Cluster) -> str:
    lines = (cluster.dir / "log" / "bbstage.log").read_text(errors="replace").splitlines()
    started = [json.loads(x) for x in lines if '"daemon started"' in x]
    return started[-1]["version"]


def landed(root: Path) -> dict[str, int]:
    """Each file that has landed under ``root`` (no temporary .part), by its inode."""
    return {str(p.relative_to(root)): p.stat().st_ino for p in root.rglob("*")
            if p.is_file() and not p.name.endswith(".part")}  # fmt: skip


def submit_pair(cluster: Cluster, workdir: Path) -> tuple[str, str, Path, Path, Path]:
    """A job staging a tree in, and a job staging a tree it wrote out."""
    src = make_tree(workdir / "src", 1500, 96 << 10, fill="rotated")
    dst, out = workdir / "in", workdir / "out"
    as_user(workdir)
    stage_in = cluster.submit(workdir, f"""#!/bin/bash
#BB_LUA stage_in source={src}/ destination={dst}/
true
""")  # fmt: skip
    stage_out = cluster.submit(workdir, f"""#!/bin/bash
#BB_LUA pool=scratch capacity=512M
#BB_LUA stage_out source=$BB_SCRATCH/made/ destination={out}/
mkdir -p "$BB_SCRATCH/made" && cp -r {src}/. "$BB_SCRATCH/made/"
""")  # fmt: skip
    return stage_in, stage_out, src, dst, out


def mid_stage(cluster: Cluster, job: str, directive: int = 0) -> bool:
    out = cluster.bbstage("status", "--json", job)
    if out.returncode != 0:  # not known yet: Slurm has not called setup
        return False
    d = json.loads(out.stdout).get("directives", [])
    return bool(d) and d[directive]["state"] == "running" and d[directive]["files_done"] > 0


def switch_under_staging(slurm: str, first: Path | None, second: Path | None) -> None:
    """Jobs staging under the install of ``first``, the daemon switched to ``second`` with
    one of them in the middle of its stage-in and the other of its stage-out."""
    c = switch(slurm, first)
    workdir = c.dir / "tests" / f"upgrade-{time.monotonic_ns()}"
    workdir.mkdir(parents=True)
    (c.dir / "tests").chmod(0o755)
    shutil.chown(workdir, USER, USER)
    job_in, job_out, src, dst, out = submit_pair(c, workdir)
    # The stage-in's workers are held (SIGSTOP) once some files have landed, so that it is
    # still in the middle when the stage-out is.
    wait_until(lambda: mid_stage(c, job_in), 240, f"job {job_in} in the middle of its stage-in")
    held = worker_pids(c.daemon_pid())
    for pid in held:
        os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: mid_stage(c, job_out), 240, f"job {job_out} in the middle of its stage-out")
    if first is None:  # this release drains; the previous one has no drain: it is stopped
        drained = c.bbstage("drain", "--deadline", "0", user=None)
        assert drained.returncode == 0, drained.stderr
    before_in, before_out = landed(dst), landed(out)
    assert 0 < len(before_in) < 1500 and 0 < len(before_out) < 1500
    c = switch(slurm, second)
    for pid in held:  # gone with the daemon that started them
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )
    expected = second.name.split("-")[1] if second is not None else bbstage.__version__
    assert daemon_version(c) == expected
    for job in (job_in, job_out):
        c.wait_gone(job, timeout=600)
        assert c.job(job)["JobState"] == "COMPLETED", c.job(job)
    assert tree_digests(dst) == tree_digests(src) == tree_digests(out)
    after_in, after_out = landed(dst), landed(out)
    assert {k: after_in[k] for k in before_in} == before_in  # never copied again
    assert {k: after_out[k] for k in before_out} == before_out
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("cluster", ["22.05", "26.05"], indirect=True)
def test_upgrade_and_rollback_under_staging_jobs(cluster: Cluster) -> None:
    old = previous_wheel()
    try:
        switch_under_staging(cluster.slurm, old, None)  # the upgrade
        switch_under_staging(cluster.slurm, None, old)  # and back
    finally:
        local_cluster_up("--slurm", cluster.slurm)  # the checkout's site install again
