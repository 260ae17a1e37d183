"""[V] bbstage as a site runs it: installed from its wheel (not editable), beside a slurmctld
that runs as the unprivileged ``slurm`` user.

``scripts/local-cluster`` builds the wheel from the checkout and installs it into a virtual
environment of its own (``BBSTAGE_SITE_DIR``); every generation's daemon, its workers,
``install-lua`` and the users' and job steps' ``bbstage`` come from there. These tests check
that nothing of the checkout leaks in, that slurmctld and its hooks run as ``slurm``, that
the demo's job stages end to end, and that ``SlurmUser=root`` still works (a smoke test).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import zipfile
from pathlib import Path

import pytest

from .conftest import REPO, USER, Cluster, local_cluster_up

pytestmark = [pytest.mark.cluster, pytest.mark.every_generation]
SITE = Path(os.environ.get("BBSTAGE_SITE_DIR", "/var/tmp/bbstage-site"))


def site_package() -> Path:
    out = subprocess.run(
        [str(SITE / "venv" / "bin" / "python"), "-c", "import bbstage; print(bbstage.__file__)"],
        capture_output=True, text=True, check=True, cwd="/",
    )  # fmt: skip
    return Path(out.stdout.strip()).parent


def daemon_start(cluster: Cluster) -> dict:
    """The daemon's last "daemon started" log line."""
    lines = (cluster.dir / "log" / "bbstage.log").read_text(errors="replace").splitlines()
    started = [json.loads(x) for x in lines if '"daemon started"' in x]
    assert started, "the daemon never logged its start"
    return started[-1]


def test_the_wheel_carries_the_hooks_and_every_shipped_file() -> None:
    """Every file git keeps under lua/ and daemon/ is in the wheel, under bbstage/share/."""
    (wheel,) = (SITE / "dist").glob("bbstage-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "lua", "daemon"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert tracked
    assert {f"bbstage/share/{p}" for p in tracked} <= names
    assert not any(n.startswith(("lua/", "daemon/", "tests/")) for n in names)


def test_daemon_workers_and_job_steps_run_the_installed_bbstage(
    cluster: Cluster, workdir: Path
) -> None:
    package = site_package()
    assert not package.is_relative_to(REPO) and package.is_relative_to(SITE)
    # The daemon: its program and its code are the site's; the checkout is not on its path
    # (its workers, started by its forkserver, get its sys.path), and it runs from /.
    pid = cluster.daemon_pid()
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[1].decode() == str(SITE / "venv" / "bin" / "bbstage")
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert not any(e.startswith(b"PYTHONPATH=") for e in environ)
    start = daemon_start(cluster)
    assert start["code"].startswith(f"{package} (Python")
    # A job step's `bbstage` (its PATH's; in a root, the root's python3 with the site's
    # package mounted) and the job's staging by the daemon's workers.
    (workdir / "in.dat").write_bytes(os.urandom(1 << 20))
    os.chown(workdir / "in.dat", *_ids(USER))
    job = cluster.submit(
        workdir,
        f"""#!/bin/bash
#BB_LUA stage_in source={workdir}/in.dat destination={workdir}/staged.dat
bbstage --version > {workdir}/version.txt 2>&1
""",
    )
    cluster.wait_gone(job)
    assert cluster.job(job)["JobState"] == "COMPLETED"
    assert (workdir / "staged.dat").read_bytes() == (workdir / "in.dat").read_bytes()
    version = (workdir / "version.txt").read_text()
    where = Path(version.split(" from ")[1].split(" (Python")[0])
    if cluster.slurm == "22.05":
        assert where == package
    else:  # the root's /opt/bbstage/bbstage: the site's package, mounted
        root = Path(f"/var/tmp/bbstage-slurm-{cluster.slurm}-root")
        mounted = (root / where.relative_to("/")).stat()
        assert (mounted.st_dev, mounted.st_ino) == (package.stat().st_dev, package.stat().st_ino)
    assert str(REPO) not in version


def test_slurmctld_and_its_hooks_run_as_slurm(cluster: Cluster) -> None:
    """SlurmUser=slurm: slurmctld and slurmscriptd (which runs every asynchronous hook) are
    the slurm user's, and the control socket is open to its group alone."""
    conf = (cluster.dir / "etc" / "slurm.conf").read_text()
    assert "\nSlurmUser=slurm\n" in conf
    pid = int((cluster.dir / "run" / "slurmctld.pid").read_text())
    slurm = pwd.getpwnam("slurm").pw_uid
    assert os.stat(f"/proc/{pid}").st_uid == slurm
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    scriptd = [c for c in children if Path(f"/proc/{c}/comm").read_text().strip() == "slurmscriptd"]
    assert scriptd and all(os.stat(f"/proc/{c}").st_uid == slurm for c in scriptd)
    sock = (cluster.dir / "run" / "control.sock").stat()
    assert sock.st_mode & 0o777 == 0o660 and sock.st_uid == 0
    assert sock.st_gid == pwd.getpwnam("slurm").pw_gid


@pytest.mark.parametrize("cluster", ["22.05", "26.05"], indirect=True)
def test_the_demo_stages_its_job_end_to_end(cluster: Cluster) -> None:
    """scripts/demo (the README's first command), from the site install, as slurm."""
    proc = subprocess.run(
        [str(REPO / "scripts" / "demo"), "--slurm", cluster.slurm],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    base = cluster.dir / "demo"
    result = (base / "data" / "result.dat").read_text().splitlines()
    digest = subprocess.run(
        ["sha256sum", str(base / "fast" / "input.dat")], capture_output=True, text=True
    ).stdout[:16]
    assert result == [digest, "reference 1", "reference 2", "reference 3"]


def _ids(user: str) -> tuple[int, int]:
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


@pytest.mark.parametrize("cluster", ["22.05"], indirect=True)
def test_slurm_user_root_still_stages_a_job(cluster: Cluster, workdir: Path) -> None:
    """The smoke test of SlurmUser=root (the old way): the 22.05 cluster brought up so, a job
    staged, then brought back to slurm for the tests after this one."""
    env = local_cluster_up("--slurm", "22.05", "--slurm-user", "root")
    try:
        root = Cluster(env, cluster.dir, "22.05")
        pid = int((cluster.dir / "run" / "slurmctld.pid").read_text())
        assert os.stat(f"/proc/{pid}").st_uid == 0
        (workdir / "in.dat").write_bytes(os.urandom(1 << 20))
        os.chown(workdir / "in.dat", *_ids(USER))
        job = root.submit(
            workdir,
            f"#!/bin/bash\n#BB_LUA stage_in source={workdir}/in.dat"
            f" destination={workdir}/staged.dat\ntrue\n",
        )
        root.wait_gone(job)
        assert root.job(job)["JobState"] == "COMPLETED"
        assert (workdir / "staged.dat").read_bytes() == (workdir / "in.dat").read_bytes()
    finally:
        local_cluster_up("--slurm", "22.05")
