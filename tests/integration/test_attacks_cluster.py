"""[G] Attacks, each as a non-root user on the real cluster: refused, clearly, with no effect.

(Reading another user's status and reaching the control socket as a user are covered in
tests/test_cli_daemon.py against a real daemon; a root-only source and a symlinked
destination in tests/integration/test_staging_cluster.py.)
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from .conftest import OTHER, Cluster, as_user

pytestmark = pytest.mark.cluster


def test_stage_out_into_another_users_directory(cluster: Cluster, workdir: Path) -> None:
    theirs = cluster.dir / "tests" / f"{OTHER}-{uuid.uuid4().hex[:6]}"
    theirs.mkdir(mode=0o700)
    shutil.chown(theirs, OTHER, OTHER)
    try:
        job = cluster.submit(
            workdir,
            f"#!/bin/bash\n#BB_LUA stage_out source={workdir}/out.dat"
            f" destination={theirs}/planted.dat\necho data > {workdir}/out.dat\n",
        )
        info = cluster.wait(job, lambda j: "permission denied" in j.get("Reason", ""), 90)
        assert f"permission denied: {theirs}" in info["Reason"]
        assert os.listdir(theirs) == []
        cluster.run("scancel", "--hurry", job, check=False)
    finally:
        shutil.rmtree(theirs)


@pytest.mark.parametrize(
    ("directive", "expected"),
    [
        ("stage_in source=/data/../etc/shadow destination=/tmp/x", "line 2"),
        ('stage_in source="/tmp/$(touch /tmp/pwned)" destination=/tmp/y', "line 2"),
        ("stage_in source=`id` destination=/tmp/z", "line 2"),
        ('stage_in source="/tmp/a\x01b" destination=/tmp/w', "line 2"),
    ],
    ids=["dot-dot", "command-substitution", "backticks", "control-char"],
)
def test_hostile_paths_fail_at_sbatch(
    cluster: Cluster, workdir: Path, directive: str, expected: str
) -> None:
    err = cluster.sbatch_error(workdir, f"#!/bin/bash\n#BB_LUA {directive}\ntrue\n")
    assert "burst_buffer/lua" in err and expected in err, err
    assert not Path("/tmp/pwned").exists()


def test_shell_metacharacters_are_just_characters(cluster: Cluster, workdir: Path) -> None:
    marker = f"pwned-{uuid.uuid4().hex[:6]}"
    name = f"a; touch {marker} & |x>y <z `touch {marker}`"
    (workdir / name).write_text("odd but legal\n")
    as_user(workdir)
    job = cluster.submit(
        workdir,
        f'#!/bin/bash\n#BB_LUA stage_in source="{workdir}/{name}" destination={workdir}/copy\n'
        "true\n",
    )
    cluster.wait_gone(job)
    assert (workdir / "copy").read_text() == "odd but legal\n"
    assert not any(marker in p.name and p.name != name for p in workdir.iterdir())


def test_ten_thousand_directives_are_refused(cluster: Cluster, workdir: Path) -> None:
    lines = "".join(
        f"#BB_LUA stage_in source=/tmp/s{i} destination=/tmp/d{i}\n" for i in range(10_000)
    )
    err = cluster.sbatch_error(workdir, f"#!/bin/bash\n{lines}true\n")
    assert "directive" in err.lower(), err


def test_ten_mib_script_is_refused(cluster: Cluster, workdir: Path) -> None:
    body = "#!/bin/bash\n#BB_LUA stage_in source=/tmp/a destination=/tmp/b\n" + "#" * 80 + "\n"
    err = cluster.sbatch_error(workdir, body * (10 * 1024 * 1024 // len(body)))
    assert err, "sbatch refused without a message"


def test_binary_garbage_is_refused_and_slurmctld_lives(cluster: Cluster, workdir: Path) -> None:
    garbage = bytes(range(256)) * 64
    script = workdir / "garbage.sh"
    script.write_bytes(b"#!/bin/bash\n#BB_LUA stage_in " + garbage + b"\ntrue\n")
    script.chmod(0o644)
    out = cluster.run("sbatch", f"--chdir={workdir}", str(script), user="bbuser1", check=False)
    assert "Submitted" not in out
    assert "idle" in cluster.run("sinfo", "-h", "-o", "%T") or cluster.run("sinfo", "-h")


def test_a_hostile_file_name_reaches_the_reason_escaped_and_bounded(
    cluster: Cluster, workdir: Path
) -> None:
    """A tree entry that the user cannot read, named to forge a slurmctld log line and to
    send an escape sequence, long enough to make a long reason: the job's Slurm reason (and
    slurmctld's log) get it escaped (\\x0a, \\x1b), never raw, and bounded (~1 KiB)."""
    tree = workdir / "tree"
    tree.mkdir()
    name = "a\nslurmctld: error: forged\x1b]0;owned\x07" + "x" * 200
    secret = tree / name
    secret.write_bytes(b"root's")
    secret.chmod(0o600)  # root's: the copy, as the user, is refused naming it
    (tree / "deep").mkdir()
    for i in range(8):  # more unreadable names: a reason that would be long
        p = tree / "deep" / (f"{i}\x1b[2J" + "y" * 240)
        p.write_bytes(b"x")
        p.chmod(0o600)
    as_user(tree / "deep")  # the directory is the user's, its files stay root's
    for p in (tree / "deep").iterdir():
        shutil.chown(p, "root", "root")
    job = cluster.submit(
        workdir, f"#!/bin/bash\n#BB_LUA stage_in source={tree}/ destination={workdir}/c/\ntrue\n"
    )
    try:
        info = cluster.wait(job, lambda j: "permission denied" in j.get("Reason", ""), 90)
        reason = info["Reason"]
        assert "\x1b" not in reason and "\n" not in reason and "\x07" not in reason
        assert "\\x0aslurmctld: error: forged\\x1b]0;owned\\x07" in reason or "\\x1b[2J" in reason
        assert len(reason) < 1400, len(reason)
        log = (cluster.dir / "log" / "slurmctld.log").read_bytes()
        assert b"\nslurmctld: error: forged" not in log and b"\x1b]0;owned" not in log
    finally:
        cluster.run("scancel", job, check=False)
        cluster.wait_gone(job, timeout=120)
