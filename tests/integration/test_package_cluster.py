"""[V] The Debian 12 package, installed on this Debian 12 host as a site installs it
(`apt-get install ./bbstage_*.deb`), runs the demo's job end to end: the daemon, its
workers, install-lua and the users' `bbstage` are the package's (/opt/bbstage), beside a
slurmctld run as slurm. Then the package is purged and the cluster runs the checkout's site
install again. (The unit's `systemd-analyze verify` and the package's files are checked in
a fresh Debian root: tests/test_packages.py.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO, Cluster, local_cluster_up

pytestmark = pytest.mark.cluster
OUT = Path("/var/tmp/bbstage-pkg-cluster")
SITE = Path("/var/tmp/bbstage-site-package")


def run(*cmd: str, env: dict[str, str] | None = None, timeout: float = 1800) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.parametrize("cluster", ["22.05"], indirect=True)
def test_the_deb_stages_the_demo_job(cluster: Cluster) -> None:
    # With the stores' backends: the cluster's config enables gs, az and sftp.
    run(str(REPO / "scripts" / "package"), "--deb", "bookworm", "--extras", "stores",
        "--out", str(OUT))  # fmt: skip
    (deb,) = OUT.glob("bbstage_*~deb12_amd64.deb")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run("apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", str(deb), env=env)
    try:
        assert "/opt/bbstage" in run("/usr/bin/bbstage", "--version")
        site = {**os.environ, "BBSTAGE_SITE_COMMAND": "/usr/bin/bbstage",
                "BBSTAGE_SITE_DIR": str(SITE)}  # fmt: skip
        demo = run(str(REPO / "scripts" / "demo"), "--slurm", "22.05", env=site, timeout=900)
        assert "reference 3" in demo  # the staged-out result
        log = (cluster.dir / "log" / "bbstage.log").read_text(errors="replace").splitlines()
        started = [json.loads(x) for x in log if '"daemon started"' in x][-1]
        assert started["code"].startswith("/opt/bbstage/lib/python3.11/site-packages/bbstage")
        base = cluster.dir / "demo"
        result = (base / "data" / "result.dat").read_text().splitlines()
        digest = run("sha256sum", str(base / "fast" / "input.dat"))[:16]
        assert result[0] == digest
    finally:
        run("apt-get", "-o", "DPkg::Lock::Timeout=600", "purge", "-y", "-q", "bbstage", env=env)
        local_cluster_up("--slurm", "22.05")  # the checkout's site install again
    assert not Path("/opt/bbstage").exists() and not Path("/usr/bin/bbstage").exists()
