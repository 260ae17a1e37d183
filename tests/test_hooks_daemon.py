"""The Lua hooks against a real daemon over a real ZeroMQ socket (no Slurm needed).

Covers both hook generations: 22.05 (data_in blocks until staged) and 24.05+ (data_in
returns at once, test_data_in answers BUSY until done), idempotency, cancel, identity.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .helpers import file_digest, make_tree, wait_until
from .hookharness import REPO, Daemon, area, daemon, script, start_daemon, user_ids, user_tree
from .luas import ENDS, lua_fixture

__all__ = ["area", "daemon"]  # fixtures
# The slowest Lua suite (~50 s an interpreter): under the oldest and the newest Lua only; the
# cheap suites (tests/test_script_bytes.py, test_zmtp_lua.py, ...) run the hooks under all four.
lua = lua_fixture(ENDS)


def owned_dir(path: Path, uid: int, gid: int) -> Path:
    path.mkdir(parents=True)
    os.chown(path, uid, gid)
    return path


def tree(root: Path, files: int, size: int) -> Path:
    """Files whose neighbours differ, made from one random block (quicker than all random)."""
    return make_tree(root, files, size, fill="rotated")


def test_slurm_22_05_flow(daemon: Daemon, area: Path) -> None:
    uid, gid = user_ids()
    data = user_tree(tree(area / "data", 30, 10_000), uid, gid)
    out = area / "out"
    out.mkdir()
    user_tree(out, uid, gid)
    job = script(
        area / "job.sh",
        f"stage_in source={data}/ destination=$BB_SCRATCH/in/",
        f"stage_out source=$BB_SCRATCH/in/ destination={out}/back/",
    )
    assert daemon.hook("slurm_bb_setup", "101", str(uid), str(gid), "(null)", "0", job) == (0, "")
    scratch = area / "daemon" / "scratch" / "101"
    assert scratch.stat().st_uid == uid and scratch.stat().st_mode & 0o777 == 0o700
    assert daemon.hook("slurm_bb_data_in", "101", job) == (0, "")
    assert len(list((scratch / "in").iterdir())) == 30
    assert daemon.hook("slurm_bb_pre_run", "101", job)[0] == 0
    assert daemon.hook("slurm_bb_post_run", "101", job)[0] == 0
    assert daemon.hook("slurm_bb_data_out", "101", job) == (0, "")
    assert {p.name: file_digest(p) for p in (out / "back").iterdir()} == {
        p.name: file_digest(p) for p in data.iterdir()
    }
    assert (out / "back" / "f00001").stat().st_uid == uid
    assert daemon.hook("slurm_bb_job_teardown", "101", job, "false")[0] == 0
    assert not scratch.exists()
    status = json.loads(daemon.cli("status", "--json", "101").stdout)
    assert status["state"] == "done"


def test_slurm_24_05_submit_and_poll(daemon: Daemon, area: Path) -> None:
    uid, gid = user_ids()
    data = user_tree(tree(area / "data", 400, 64 << 10), uid, gid)
    job = script(area / "job.sh", f"stage_in source={data}/ destination=$BB_SCRATCH/in/")
    u, g = str(uid), str(gid)
    assert daemon.hook("slurm_bb_setup", "102", u, g, "scratch", "0", job, None)[0] == 0
    started = time.monotonic()
    assert daemon.hook("slurm_bb_data_in", "102", job, u, g, None) == (0, "")
    assert time.monotonic() - started < 2  # returned without waiting for the data
    answers = []

    def answered() -> bool:
        rc, message = daemon.hook("slurm_bb_test_data_in", "102", job, u, g, None)
        assert rc == 0
        answers.append(message)
        return message != "BUSY"

    wait_until(answered, 120, "test_data_in to stop answering BUSY", every=0.05)
    assert answers[-1] == ""
    assert len(list((area / "daemon" / "scratch" / "102" / "in").iterdir())) == 400


def test_requests_are_idempotent(daemon: Daemon, area: Path) -> None:
    uid, gid = user_ids()
    src = area / "f.dat"
    src.write_bytes(os.urandom(1 << 20))
    user_tree(area, uid, gid)
    dst = area / "dst.dat"
    job = script(area / "job.sh", f"stage_in source={src} destination={dst}")
    for _ in range(2):  # Slurm re-runs hooks after timeouts
        assert daemon.hook("slurm_bb_setup", "103", str(uid), str(gid), "(null)", "0", job)[0] == 0
    assert daemon.hook("slurm_bb_data_in", "103", job) == (0, "")
    first = dst.stat().st_ino
    assert daemon.hook("slurm_bb_data_in", "103", job) == (0, "")
    assert dst.stat().st_ino == first  # not copied again


def test_a_finished_stage_in_is_answered_from_its_mark(lua: str, area: Path) -> None:
    """The daemon marks a finished stage-in; data_in and test_data_in then answer without
    a round trip. A restart, teardown and a new setup of the job id take the mark away."""
    d = start_daemon(area / "daemon", lua=lua)
    uid, gid = user_ids()
    u, g = str(uid), str(gid)
    data = user_tree(tree(area / "data", 3, 1000), uid, gid)
    job = script(area / "job.sh", f"stage_in source={data}/ destination=$BB_SCRATCH/in/")
    marks = area / "daemon" / "run" / "staged"
    assert d.hook("slurm_bb_setup", "110", u, g, "(null)", "0", job) == (0, "")
    wait_until((marks / "110").exists, 60, "the mark of a finished stage-in")
    assert marks.stat().st_uid == 0 and marks.stat().st_mode & 0o777 == 0o755
    d.stop()
    assert d.hook("slurm_bb_data_in", "110", job) == (0, "")  # no daemon to ask
    assert d.hook("slurm_bb_test_data_in", "110", job, u, g, None) == (0, "")
    rc, message = d.hook("slurm_bb_data_in", "111", job)
    assert rc != 0 and "not reachable" in message
    d = start_daemon(area / "daemon", lua=lua)
    try:
        assert not (marks / "110").exists()  # a restart vouches for nothing
        assert d.hook("slurm_bb_data_in", "110", job) == (0, "")  # asked: done
        assert d.hook("slurm_bb_job_teardown", "110", job, "false")[0] == 0
        assert not (marks / "110").exists()
        # A new setup of the job id drops a mark from an earlier run, whatever comes next.
        (marks / "110").touch()
        gone = script(area / "gone.sh", f"stage_in source={area}/missing destination={area}/x")
        assert d.hook("slurm_bb_setup", "110", u, g, "(null)", "0", gone) == (0, "")
        rc, message = d.hook("slurm_bb_data_in", "110", gone)
        assert rc != 0 and "missing" in message, message
        assert not (marks / "110").exists()
    finally:
        d.stop()


def test_teardown_hurry_aborts_within_two_seconds(daemon: Daemon, area: Path) -> None:
    uid, gid = user_ids()
    data = user_tree(tree(area / "data", 4000, 256 << 10), uid, gid)
    dst = owned_dir(area / "mine", uid, gid) / "dst"
    job = script(area / "job.sh", f"stage_in source={data}/ destination={dst}/")
    u, g = str(uid), str(gid)
    assert daemon.hook("slurm_bb_setup", "104", u, g, "(null)", "0", job)[0] == 0
    assert daemon.hook("slurm_bb_data_in", "104", job, u, g, None)[0] == 0
    wait_until(lambda: dst.exists() and len(list(dst.iterdir())) >= 10, 60, "10 files staged")
    started = time.monotonic()
    assert daemon.hook("slurm_bb_job_teardown", "104", job, "true")[0] == 0
    assert time.monotonic() - started < 2
    assert [p for p in dst.iterdir() if ".bbstage-" in p.name] == []
    assert len(list(dst.iterdir())) < 4000
    status = json.loads(daemon.cli("status", "--json", "104").stdout)
    assert status["state"] == "cancelled"


def test_root_only_source_is_refused_and_nothing_lands(daemon: Daemon, area: Path) -> None:
    uid, gid = user_ids()
    secret = area / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    dst = area / "mine"
    dst.mkdir()
    user_tree(dst, uid, gid)
    job = script(area / "job.sh", f"stage_in source={secret} destination={dst}/secret")
    assert daemon.hook("slurm_bb_setup", "105", str(uid), str(gid), "(null)", "0", job)[0] == 0
    rc, message = daemon.hook("slurm_bb_data_in", "105", job)
    assert rc != 0
    assert message == f"stage_in line 2: permission denied: {secret}"
    assert list(dst.iterdir()) == []
    # A job of root's own is refused at setup, before anything is created.
    rc, message = daemon.hook("slurm_bb_setup", "115", "0", "0", "(null)", "0", job)
    assert rc != 0 and "never stages data for root" in message
    assert daemon.cli("status", "115").returncode == 3


def test_destination_symlink_to_root_file_is_not_written_through(
    daemon: Daemon, area: Path
) -> None:
    uid, gid = user_ids()
    victim = area / "root-owned.conf"
    victim.write_text("precious\n")
    victim.chmod(0o644)
    mine = area / "mine"
    mine.mkdir()
    (mine / "in.dat").write_text("user data\n")
    os.symlink(victim, mine / "out.dat")
    user_tree(mine, uid, gid)
    job = script(area / "job.sh", f"stage_in source={mine}/in.dat destination={mine}/out.dat")
    assert daemon.hook("slurm_bb_setup", "106", str(uid), str(gid), "(null)", "0", job)[0] == 0
    assert daemon.hook("slurm_bb_data_in", "106", job)[0] == 0
    assert victim.read_text() == "precious\n"
    assert not (mine / "out.dat").is_symlink()  # the link itself was replaced, as the user
    assert (mine / "out.dat").read_text() == "user data\n"


def test_hook_fails_at_once_when_daemon_is_down(lua: str, area: Path) -> None:
    d = start_daemon(area / "d", lua=lua)
    d.stop()
    uid, gid = user_ids()
    job = script(area / "job.sh", "stage_in source=/etc/hostname destination=/tmp/x")
    started = time.monotonic()
    rc, message = d.hook("slurm_bb_setup", "107", str(uid), str(gid), "(null)", "0", job)
    assert rc != 0 and "staging daemon not reachable" in message
    assert time.monotonic() - started < 5  # after a 3 s grace for restarts


def test_kill_9_mid_stage_in_then_restart_completes(lua: str, area: Path) -> None:
    d = start_daemon(area / "d", lua=lua)
    uid, gid = user_ids()
    data = user_tree(tree(area / "data", 3000, 128 << 10), uid, gid)
    dst = owned_dir(area / "mine", uid, gid) / "dst"
    job = script(area / "job.sh", f"stage_in source={data}/ destination={dst}/")
    assert d.hook("slurm_bb_setup", "108", str(uid), str(gid), "(null)", "0", job)[0] == 0
    hook = subprocess.Popen(  # a 22.05 data_in: waits, reconnects, re-sends
        [d.lua, str(REPO / "tests/lua/call_hook.lua"), str(d.etc), "slurm_bb_data_in", "108",
         job],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_until(lambda: dst.exists() and len(list(dst.iterdir())) >= 50, 60, "50 files staged")
    assert walks(uid), "3,000 entries: the worker walks them in a process of its own"
    d.kill()  # returns once the process has ended; start_daemon waits for the new one
    d2 = start_daemon(area / "d", lua=lua)
    try:
        out, _ = hook.communicate(timeout=120)
        assert out.startswith("rc=0"), out
        assert sorted(p.name for p in dst.iterdir()) == sorted(p.name for p in data.iterdir())
        for p in data.iterdir():
            assert file_digest(dst / p.name) == file_digest(p)
        wait_until(lambda: not walks(uid), 10, "no walk process left")
    finally:
        d2.stop()


def walks(uid: int) -> list[int]:
    """The processes of ``uid`` walking a tree for a worker (``bbstage.transfer.walkproc``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            owner = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        if owner == uid and b"bbstage.transfer.walkproc" in cmdline:
            found.append(int(pid))
    return found


def test_status_is_private(daemon: Daemon, area: Path) -> None:
    uid, gid = user_ids()
    job = script(area / "job.sh", f"stage_in source={area}/secret-name.dat destination=/tmp/x")
    daemon.hook("slurm_bb_setup", "109", str(uid), str(gid), "(null)", "0", job)
    mine = daemon.cli("status", "109", user="bbuser1")
    # setup has started the stage-in (which will fail: no such file); the owner sees it all
    assert mine.returncode in (0, 1) and "secret-name.dat" in mine.stdout
    other = daemon.cli("status", "109", user="bbuser2")
    assert other.returncode == 3
    assert "secret-name" not in other.stdout + other.stderr
    assert "no staging job of yours" in other.stderr
    assert "secret-name.dat" in daemon.cli("status", "109").stdout  # root sees everything


def test_failed_stage_out_keeps_scratch(daemon: Daemon, area: Path) -> None:
    uid, gid = user_ids()
    locked = area / "locked"
    locked.mkdir(mode=0o755)  # root's: the user cannot write here
    job = script(area / "job.sh", f"stage_out source=$BB_SCRATCH/out.dat destination={locked}/o")
    assert daemon.hook("slurm_bb_setup", "110", str(uid), str(gid), "(null)", "0", job)[0] == 0
    scratch = area / "daemon" / "scratch" / "110"
    (scratch / "out.dat").write_text("results of a long run\n")
    os.chown(scratch / "out.dat", uid, gid)
    assert daemon.hook("slurm_bb_pre_run", "110", job)[0] == 0
    rc, message = daemon.hook("slurm_bb_data_out", "110", job)
    assert rc != 0 and f"permission denied: {locked}" in message
    assert daemon.hook("slurm_bb_job_teardown", "110", job, "true")[0] == 0
    assert (scratch / "out.dat").read_text() == "results of a long run\n"
    status = json.loads(daemon.cli("status", "--json", "110").stdout)
    assert status["state"] == "failed"
    assert f"outputs kept in {scratch}" in status["error"]


def test_hook_rides_out_a_daemon_restart(lua: str, area: Path) -> None:
    d = start_daemon(area / "d", lua=lua)
    d.stop()
    uid, gid = user_ids()
    job = script(area / "job.sh", "stage_in source=/etc/hostname destination=/tmp/x")
    hook = subprocess.Popen(
        [d.lua, str(REPO / "tests/lua/call_hook.lua"), str(d.etc), "slurm_bb_setup", "111",
         str(uid), str(gid), "(null)", "0", job],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    # The outage is the point, not a wait: the hook finds no daemon for its first second and
    # must ride it out (it tries again for 3 s).
    time.sleep(1)
    d2 = start_daemon(area / "d", lua=lua)
    try:
        out, _ = hook.communicate(timeout=30)
        assert out.startswith("rc=0"), out
    finally:
        d2.stop()


def test_symlink_swapped_in_during_the_copy_is_not_written_through(
    daemon: Daemon, area: Path
) -> None:
    uid, gid = user_ids()
    victim = area / "root-owned.conf"
    victim.write_text("precious\n")
    victim.chmod(0o644)
    data = user_tree(tree(area / "data", 3000, 64 << 10), uid, gid)
    dst = owned_dir(area / "mine", uid, gid) / "dst"
    job = script(area / "job.sh", f"stage_in source={data}/ destination={dst}/")
    u, g = str(uid), str(gid)
    assert daemon.hook("slurm_bb_setup", "112", u, g, "(null)", "0", job)[0] == 0
    assert daemon.hook("slurm_bb_data_in", "112", job, u, g, None)[0] == 0
    wait_until(lambda: dst.exists() and len(os.listdir(dst)) >= 5, 60, "5 files staged")
    last = dst / "f02999"  # not copied yet: the attacker plants a link under its name
    os.symlink(victim, last)
    os.chown(last, uid, gid, follow_symlinks=False)
    wait_until(
        lambda: daemon.hook("slurm_bb_test_data_in", "112", job, u, g, None)[1] != "BUSY",
        60,
        "test_data_in to stop answering BUSY",
    )
    assert victim.read_text() == "precious\n"
    assert not last.is_symlink() and file_digest(last) == file_digest(data / "f02999")


def test_pool_accounting_returns_after_a_failed_job(daemon: Daemon, area: Path) -> None:
    uid, gid = user_ids()
    big = area / "big.dat"
    big.write_bytes(os.urandom(3 << 20))
    user_tree(big, uid, gid)

    def reserved() -> int:
        return json.loads(daemon.cli("pools", "--json").stdout)["scratch"]["reserved"]

    before = reserved()
    job = script(area / "job.sh", f"stage_in source={big} destination=$BB_SCRATCH/big.dat")
    assert (
        daemon.hook("slurm_bb_setup", "113", str(uid), str(gid), "scratch", str(2 << 20), job)[0]
        == 0
    )
    # held until the stage-in setup started has failed (it may have by now)
    assert reserved() in (before, before + (2 << 20))
    rc, message = daemon.hook("slurm_bb_data_in", "113", job)
    assert rc != 0 and "does not fit in $BB_SCRATCH" in message
    assert daemon.hook("slurm_bb_job_teardown", "113", job, "true")[0] == 0
    assert reserved() == before
    assert not (area / "daemon" / "scratch" / "113").exists()
    # A job asking for more than the pool has free is refused at setup.
    rc, message = daemon.hook(
        "slurm_bb_setup", "114", str(uid), str(gid), "scratch", str(128 << 20), job
    )
    assert rc != 0 and "pool scratch has" in message
    assert not (area / "daemon" / "scratch" / "114").exists()


def test_a_second_daemon_on_the_same_state_refuses_to_start(daemon: Daemon) -> None:
    second = subprocess.run(
        [sys.executable, "-m", "bbstage.cli.main", "--config", str(daemon.config), "daemon"],
        capture_output=True, text=True, timeout=30, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert second.returncode == 1
    assert f"another bbstage daemon (pid {daemon.proc.pid})" in second.stderr
    assert daemon.proc.poll() is None  # the first one is untouched


def test_a_restarted_daemon_resumes_a_stage_in_nobody_asks_for_again(lua: str, area: Path) -> None:
    """24.05+ hooks only poll test_data_in, which starts nothing: after a crash the daemon
    must resume the stage-in by itself (Engine.resume), or the job waits for ever."""
    d = start_daemon(area / "d", lua=lua)
    uid, gid = user_ids()
    u, g = str(uid), str(gid)
    data = user_tree(tree(area / "data", 1500, 128 << 10), uid, gid)
    dst = owned_dir(area / "mine", uid, gid) / "dst"
    job = script(area / "job.sh", f"stage_in source={data}/ destination={dst}/")
    assert d.hook("slurm_bb_setup", "116", u, g, "(null)", "0", job)[0] == 0
    wait_until(lambda: dst.exists() and len(list(dst.iterdir())) >= 30, 60, "30 files staged")
    d.kill()
    assert len(list(dst.iterdir())) < 1500, "the kill came too late"
    d2 = start_daemon(area / "d", lua=lua)
    try:
        wait_until(
            lambda: d2.hook("slurm_bb_test_data_in", "116", job, u, g, None) == (0, ""),
            120,
            "test_data_in to answer done after the restart",
        )
        assert sorted(p.name for p in dst.iterdir()) == sorted(p.name for p in data.iterdir())
        for p in data.iterdir():
            assert file_digest(dst / p.name) == file_digest(p)
    finally:
        d2.stop()


def test_hooks_for_a_job_the_daemon_lost_remove_its_temporary_files(
    daemon: Daemon, area: Path
) -> None:
    """teardown (22.05 and 24.05+) and test_data_in (24.05+) send the script's path: a
    daemon with no record of the job (its state lost) finds its workers' temporary files
    from it and removes them as their owner."""
    uid, gid = user_ids()
    dst = owned_dir(area / "mine", uid, gid)
    job = script(area / "job.sh", f"stage_in source={area}/big.bin destination={dst}/big.bin")
    calls = [
        ("116", "slurm_bb_job_teardown", ("116", job, "true")),
        ("117", "slurm_bb_job_teardown", ("117", job, "true", str(uid), str(gid))),
        ("118", "slurm_bb_test_data_in", ("118", job, str(uid), str(gid))),
    ]
    for job_id, hook, args in calls:
        part = dst / f".big.bin.bbstage-{job_id}-0123abcd.part"
        part.write_bytes(b"partial")
        os.chown(part, uid, gid)
        daemon.hook(hook, *args)
        assert not part.exists(), hook
