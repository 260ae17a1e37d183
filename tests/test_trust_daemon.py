"""Faults against a real daemon and the real Lua hooks (issue [K]: I1, I3, I7).

Every test checks bytes: each staged file's sha256 against its source's, and that no
temporary file is left, after SIGTERM of the daemon, SIGKILL of a worker or of the daemon.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from . import helpers
from .helpers import make_tree, tree_digests, wait_until
from .hookharness import (
    REPO,
    Daemon,
    area,
    hooks_without_daemon,
    script,
    start_daemon,
    user_ids,
    user_tree,
)
from .luas import ENDS, lua_fixture

__all__ = ["area"]  # fixture
# Faults of the daemon, with the hooks (and their reconnections) under the oldest and the
# newest Lua: what differs between Lua versions differs between these two (tests/luas.py).
lua = lua_fixture(ENDS)


def temps(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*.part")]


def blocking_data_in(d: Daemon, job_id: str, job: str) -> subprocess.Popen[str]:
    """A 22.05 data_in: blocks until staged; reconnects and re-sends across a restart."""
    return subprocess.Popen(
        [d.lua, str(REPO / "tests/lua/call_hook.lua"), str(d.etc), "slurm_bb_data_in", job_id,
         job],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def workers(d: Daemon, uid: int) -> list[int]:
    """Worker processes of the daemon running as ``uid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        if int(uids[0]) == uid and b"multiprocessing" in cmdline:
            pids.append(int(entry.name))
    return pids


def set_up_stage_in(
    d: Daemon, area: Path, job_id: str, files: int, size: int
) -> tuple[Path, Path, str]:
    """A tree of the test user's, a destination of theirs, and a job staging one into the
    other, set up (setup hook, as 22.05 calls it): (source, destination, script)."""
    uid, gid = user_ids()
    data = user_tree(make_tree(area / "data", files, size), uid, gid)
    (area / "mine").mkdir()
    dst = user_tree(area / "mine", uid, gid) / "dst"
    job = script(area / "job.sh", f"stage_in source={data}/ destination={dst}/")
    assert d.hook("slurm_bb_setup", job_id, str(uid), str(gid), "(null)", "0", job)[0] == 0
    return data, dst, job


def test_sigterm_mid_stage_in_resumes_and_every_file_lands(lua: str, area: Path) -> None:
    """The issue's reproduction: three jobs stage the same 300-file tree; the daemon gets
    SIGTERM (systemctl restart) mid-copy. It used to record the transfers done, and the jobs
    ran on 169-183 of the 300 files. Now data_in answers only when every file is in place."""
    d = start_daemon(area / "d", lua=lua)
    uid, gid = user_ids()
    data = user_tree(make_tree(area / "data", 300, 400 << 10), uid, gid)
    (area / "mine").mkdir()
    mine = user_tree(area / "mine", uid, gid)
    jobs = {}
    for n in range(3):
        job_id = str(300 + n)
        dst = mine / f"dst{n}"
        job = script(area / f"job{n}.sh", f"stage_in source={data}/ destination={dst}/")
        assert d.hook("slurm_bb_setup", job_id, str(uid), str(gid), "(null)", "0", job)[0] == 0
        jobs[job_id] = (dst, blocking_data_in(d, job_id, job))
    wait_until(
        lambda: all(len(list(dst.glob("f*"))) >= 20 for dst, _ in jobs.values()),
        60,
        "20 files staged for each job",
    )
    d.stop()  # SIGTERM
    assert any(len(list(dst.glob("f*"))) < 300 for dst, _ in jobs.values()), "too late"
    d2 = start_daemon(area / "d", lua=lua)
    try:
        expected = tree_digests(data)
        for dst, hook in jobs.values():
            out, _ = hook.communicate(timeout=180)
            assert out.startswith("rc=0"), out
            assert tree_digests(dst) == expected
            assert temps(dst) == []
    finally:
        d2.stop()


def test_a_killed_worker_is_run_again_and_the_job_completes(lua: str, area: Path) -> None:
    d = start_daemon(area / "d", lua=lua)
    uid, gid = user_ids()
    data, dst, job = set_up_stage_in(d, area, "310", 40, 4 << 20)  # named .part temp files
    try:
        hook = blocking_data_in(d, "310", job)
        wait_until(
            lambda: dst.exists() and len(list(dst.iterdir())) >= 3 and workers(d, uid),
            60,
            "3 files staged and a worker running",
        )
        for pid in workers(d, uid):
            os.kill(pid, signal.SIGKILL)
        out, _ = hook.communicate(timeout=180)
        assert out.startswith("rc=0"), out
        assert tree_digests(dst) == tree_digests(data)
        assert temps(dst) == []
    finally:
        d.stop()


def kill_with_a_temporary_file(d: Daemon, dst: Path, uid: int) -> None:
    """The daemon and its workers killed while a temporary file exists (tests/helpers.py)."""
    helpers.kill_with_a_temporary_file(dst, lambda: workers(d, uid), d.proc.pid)
    d.proc.wait(20)


def test_sigkill_of_the_daemon_leaves_no_temp_file_after_the_restart(lua: str, area: Path) -> None:
    """I3: a worker killed with the daemon may leave a named ``.part`` file; the resumed
    transfer removes it."""
    d = start_daemon(area / "d", lua=lua)
    uid, gid = user_ids()
    data, dst, job = set_up_stage_in(d, area, "320", 24, 8 << 20)
    hook = blocking_data_in(d, "320", job)
    kill_with_a_temporary_file(d, dst, uid)
    d2 = start_daemon(area / "d", lua=lua)
    try:
        out, _ = hook.communicate(timeout=180)
        assert out.startswith("rc=0"), out
        assert tree_digests(dst) == tree_digests(data)
        assert temps(dst) == []
    finally:
        d2.stop()


def test_a_lost_state_after_a_killed_worker_leaves_no_temp_file(lua: str, area: Path) -> None:
    """I3, the double fault CI found: a worker SIGKILLed, then the daemon, and its database
    lost before the worker's temporary file was removed. The job is unknown after the
    restart (22.05 gives data_in no uid to make it again): the re-sent data_in, refused,
    removes the file, found from the script it carries; so do teardown and test_data_in,
    from the script Slurm kept (their own test: tests/test_hooks_daemon.py)."""
    d = start_daemon(area / "d", lua=lua)
    uid, _ = user_ids()
    _, dst, job = set_up_stage_in(d, area, "325", 24, 8 << 20)
    hook = blocking_data_in(d, "325", job)
    kill_with_a_temporary_file(d, dst, uid)
    for db in (area / "d" / "state").glob("state.db*"):
        db.unlink()
    d2 = start_daemon(area / "d", lua=lua)
    try:
        out, _ = hook.communicate(timeout=180)
        assert out.startswith("rc=-1") and "unknown to the staging daemon" in out, out
        assert temps(dst) == []
    finally:
        d2.stop()


def test_a_blocking_data_in_never_takes_busy_for_staged(lua: str, tmp_path: Path) -> None:
    """Before 24.05 any success from data_in starts the job: a daemon's "busy" must fail it."""
    from .test_zmtp_lua import Router

    d = hooks_without_daemon(tmp_path, lua)
    router = Router(tmp_path / "control.sock", lambda r, msg: r.reply(msg, b"busy", b""))
    try:
        job = script(tmp_path / "job.sh", "stage_in source=/a destination=/b")
        for hook in ("slurm_bb_data_in", "slurm_bb_data_out"):
            rc, message = d.hook(hook, "330", job)  # 22.05: no uid
            assert rc != 0 and "not finished" in message, (hook, rc, message)
    finally:
        router.close()


def test_workers_do_not_outlive_a_killed_daemon(lua: str, area: Path) -> None:
    """A worker left copying by a SIGKILLed daemon would race the restarted daemon's
    attempt at the same files (the campaign saw one fail that way)."""
    d = start_daemon(area / "d", lua=lua)
    uid, _ = user_ids()
    set_up_stage_in(d, area, "340", 24, 8 << 20)
    wait_until(lambda: workers(d, uid), 60, "a worker process")
    d.kill()
    wait_until(lambda: not workers(d, uid), 5, "the workers to end with the daemon")


def test_paths_with_one_pool_needs_no_script(lua: str, area: Path) -> None:
    """Slurm 24.11 held split-off array tasks: slurm_bb_paths could not read their script
    (the campaign found it). With one pool there is nothing in the script to look for."""
    d = start_daemon(area / "d", lua=lua)
    try:
        path_file = area / "paths"
        rc, _ = d.hook("slurm_bb_paths", "350", str(area / "no-such-script"), str(path_file))
        assert rc == 0
        assert path_file.read_text() == f"BB_SCRATCH={area}/d/scratch/350\n"
    finally:
        d.stop()
