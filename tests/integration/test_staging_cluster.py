"""[C] The staging engine on the real cluster: crashes, identity, symlinks, capacity."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.helpers import file_digest, make_tree, process_gone, wait_until

from .conftest import USER, Cluster, as_user

pytestmark = pytest.mark.cluster


def test_daemon_killed_mid_stage_in_resumes_and_checksums_match(
    cluster: Cluster, workdir: Path
) -> None:
    src = make_tree(workdir / "src", 2500, 256 << 10)
    as_user(workdir)
    dst = workdir / "dst"
    job = cluster.submit(
        workdir,
        f"#!/bin/bash\n#BB_LUA stage_in source={src}/ destination={dst}/ checksum=xxh3\n"
        f"ls {dst} | wc -l > count.txt\n",
    )
    wait_until(lambda: dst.exists() and len(os.listdir(dst)) >= 100, 60, "100 files staged")
    pid = cluster.daemon_pid()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: process_gone(pid), 20, f"the killed daemon (pid {pid}) to end")
    cluster.up()  # restarts only the daemon
    cluster.wait_gone(job, timeout=180)
    assert cluster.job(job)["JobState"] == "COMPLETED"
    assert (workdir / "count.txt").read_text().strip() == "2500"
    assert sorted(os.listdir(dst)) == sorted(os.listdir(src))
    assert all(file_digest(dst / name) == file_digest(src / name) for name in os.listdir(src))


def test_root_only_source_is_refused_and_nothing_lands(cluster: Cluster, workdir: Path) -> None:
    secret = cluster.dir / "tests" / f"root-only-{workdir.name}"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    try:
        job = cluster.submit(
            workdir,
            f"#!/bin/bash\n#BB_LUA stage_in source={secret} destination={workdir}/stolen\ntrue\n",
        )
        info = cluster.wait(job, lambda j: "permission denied" in j.get("Reason", ""), 60)
        assert f"permission denied: {secret}" in info["Reason"]
        assert not (workdir / "stolen").exists()
        assert [p for p in workdir.iterdir() if "bbstage" in p.name] == []
        cluster.run("scancel", job)
    finally:
        secret.unlink()


def test_symlinked_destination_is_not_written_through(cluster: Cluster, workdir: Path) -> None:
    victim = cluster.dir / "tests" / f"root-owned-{workdir.name}"
    victim.write_text("precious\n")
    victim.chmod(0o644)
    (workdir / "in.dat").write_text("user data\n")
    os.symlink(victim, workdir / "out.dat")
    as_user(workdir)
    try:
        job = cluster.submit(
            workdir,
            f"#!/bin/bash\n#BB_LUA stage_in source={workdir}/in.dat destination={workdir}/out.dat"
            "\ntrue\n",
        )
        cluster.wait_gone(job)
        assert victim.read_text() == "precious\n"
        assert not (workdir / "out.dat").is_symlink()
        assert (workdir / "out.dat").read_text() == "user data\n"
        assert (workdir / "out.dat").stat().st_uid != 0
    finally:
        victim.unlink()


def test_stage_in_beyond_capacity_is_held_and_leaves_nothing(
    cluster: Cluster, workdir: Path
) -> None:
    (workdir / "big.dat").write_bytes(os.urandom(3 << 20))
    as_user(workdir)
    job = cluster.submit(
        workdir,
        "#!/bin/bash\n#BB_LUA pool=scratch capacity=2M\n"
        f"#BB_LUA stage_in source={workdir}/big.dat destination=$BB_SCRATCH/big.dat\ntrue\n",
    )
    info = cluster.wait(job, lambda j: "does not fit" in j.get("Reason", ""), 60)
    assert "capacity=" in info["Reason"]
    scratch = Path(cluster.status(job)["scratch"])
    assert not scratch.exists() or list(scratch.iterdir()) == []
    cluster.run("scancel", job)
    wait_until(
        lambda: cluster.status(job)["state"] in ("cancelled", "failed", "done"),
        30,
        lambda: f"the cancelled job to end; its status: {cluster.status(job)}",
    )
    pools = cluster.bbstage("pools", "--json")
    assert pools.returncode == 0


def test_daemon_down_at_submit_holds_then_stages_after_release(
    cluster: Cluster, workdir: Path
) -> None:
    (workdir / "in.dat").write_text("hello\n")
    as_user(workdir)
    os.kill(cluster.daemon_pid(), signal.SIGTERM)
    wait_until(
        lambda: not (cluster.dir / "run" / "control.sock").exists(),
        20,
        "the stopped daemon to remove its socket",
    )
    try:
        job = cluster.submit(
            workdir,
            f"#!/bin/bash\n#BB_LUA stage_in source={workdir}/in.dat destination={workdir}/out.dat"
            "\ntrue\n",
        )
        info = cluster.wait(
            job, lambda j: "staging daemon not reachable" in j.get("Reason", ""), 60
        )
        assert info["JobState"] == "PENDING"
    finally:
        cluster.up()
    cluster.run("scontrol", "release", job)
    cluster.wait_gone(job)
    assert cluster.job(job)["JobState"] == "COMPLETED"
    assert (workdir / "out.dat").read_text() == "hello\n"


def test_owner_of_staged_files_is_the_job_user(cluster: Cluster, workdir: Path) -> None:
    (workdir / "a").write_text("a")
    as_user(workdir)
    job = cluster.submit(
        workdir,
        f"#!/bin/bash\n#BB_LUA stage_in source={workdir}/a destination={workdir}/b\ntrue\n",
    )
    cluster.wait_gone(job)
    assert (workdir / "b").owner() == USER
