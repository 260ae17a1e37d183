"""[V] `bbstage drain`: a daemon stopped for an upgrade fails no job. New work is answered
"ask again" and the real hooks (every Lua at the ends) ask again until the next daemon
answers; a running transfer finishes within the deadline, or is stopped at it and resumed by
the next daemon; what waited in the queue waits for the next daemon. Files hashed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bbstage.daemon import drain
from bbstage.daemon.state import JobState

from .helpers import file_digest, wait_until
from .hookharness import (  # noqa: F401
    REPO,
    area,
    script,
    stage_in_started,
    start_daemon,
    user_ids,
)
from .luas import ENDS, lua_fixture

lua = lua_fixture(ENDS)


def test_what_a_draining_daemon_still_answers() -> None:
    assert not drain.answers("setup", None) and not drain.answers("copy", JobState.RUNNING)
    assert not drain.answers("data_in", JobState.SETUP)  # would start the stage-in
    assert drain.answers("data_in", JobState.STAGING_IN)  # 22.05's wait for it
    assert not drain.answers("data_out", JobState.RUNNING)
    assert drain.answers("data_out", JobState.STAGING_OUT)
    for op in ("test_data_in", "test_data_out", "pre_run", "post_run", "teardown", "paths"):
        assert drain.answers(op, JobState.STAGING_IN)


def hook_in_background(d, *args: str) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    return subprocess.Popen(
        [d.lua, str(REPO / "tests" / "lua" / "call_hook.lua"), str(d.etc), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def setup_in_background(d, where: Path, job: str, source: Path):  # type: ignore[no-untyped-def]
    """Slurm's setup of a new job (24.05+), asking in the background."""
    uid, gid = user_ids()
    path = script(where / f"{job}.sh", f"stage_in source={source} destination={where}/out/{job}")
    return path, hook_in_background(d, "slurm_bb_setup", job, str(uid), str(gid), "scratch",
                                    "0", path, "nil")  # fmt: skip


def test_a_drain_fails_no_job_and_the_next_daemon_answers(
    area: Path,  # noqa: F811
    lua: str,
) -> None:
    root = area / "daemon"
    d = start_daemon(root, lua=lua)
    held = stage_in_started(d, area, "601", 256 << 20, hold=True)  # cannot end meanwhile
    refused = d.cli("drain", "--deadline", "0", user="bbuser1")
    assert refused.returncode != 0 and "for root on this host" in refused.stderr
    started = time.monotonic()
    drained = d.cli("drain", "--deadline", "3")
    assert drained.returncode == 0, drained.stderr
    assert "1 transfers running" in drained.stdout and "has stopped" in drained.stdout
    assert time.monotonic() - started >= 3  # the deadline, then stopped as on SIGTERM
    d.proc.wait(10)
    # New work while no daemon runs: the hook asks again through the gap.
    _, waiting = setup_in_background(d, area, "602", held.source)
    time.sleep(2)
    assert waiting.poll() is None  # still asking
    d = start_daemon(root, lua=lua)
    try:
        rc, _ = waiting.communicate(timeout=60)
        assert waiting.returncode == 0 and rc.startswith("rc=0"), rc
        # The held transfer resumes under the next daemon and lands whole.
        assert d.hook("slurm_bb_data_in", "601", held.script) == (0, "")
        assert file_digest(held.destination) == file_digest(held.source)
        status = json.loads(d.cli("status", "--json", "602").stdout)
        assert status["state"] in ("setup", "staging_in", "staged_in")
    finally:
        d.stop()


def test_new_work_during_a_drain_is_asked_again_and_answered_by_the_next_daemon(
    area: Path,  # noqa: F811
    lua: str,
) -> None:
    """While the daemon drains (a running transfer keeps it), a setup that would start work
    is answered "again"; the hook keeps asking and the next daemon answers it; the running
    transfer ends whole within the deadline."""
    root = area / "daemon"
    d = start_daemon(root, lua=lua)
    running = stage_in_started(d, area, "611", 256 << 20, hold=True)
    workers = running.held
    drained = d.cli("drain", "--deadline", "60", "--no-wait")
    assert drained.returncode == 0, drained.stderr
    new, asking = setup_in_background(d, area, "612", running.source)
    time.sleep(2)
    assert asking.poll() is None  # answered "again", asking again
    assert d.proc.poll() is None  # still draining: the transfer runs
    for pid in workers:
        os.kill(pid, signal.SIGCONT)
    d.proc.wait(60)  # the transfer ended: the daemon stopped by itself
    assert file_digest(running.destination) == file_digest(running.source)
    d = start_daemon(root, lua=lua)
    try:
        rc, _ = asking.communicate(timeout=60)
        assert asking.returncode == 0 and rc.startswith("rc=0"), rc
        uid, gid = user_ids()
        assert d.hook("slurm_bb_data_in", "612", new, str(uid), str(gid), None)[0] == 0
        wait_until(lambda: (area / "out" / "612").exists(), 60, "the new job's stage-in")
    finally:
        d.stop()


@pytest.mark.parametrize("lua", ["lua5.1"], indirect=True)
def test_an_in_job_copy_during_a_drain_is_asked_again(area: Path, lua: str) -> None:  # noqa: F811
    """The client says the daemon drains and asks again (a running transfer keeps it)."""
    d = start_daemon(area / "daemon", lua=lua)
    workers = stage_in_started(d, area, "621", 256 << 20, hold=True).held
    try:
        drained = d.cli("drain", "--deadline", "60", "--no-wait")
        assert drained.returncode == 0, drained.stderr
        copy = subprocess.Popen(
            [sys.executable, "-m", "bbstage.cli.main", "--config", str(d.config), "copy",
             "/tmp/x", "/tmp/y", "--job", "621"],
            stderr=subprocess.PIPE, text=True, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert copy.stderr is not None
        said = copy.stderr.readline()
        assert "draining for an upgrade" in said and "asking again" in said
        assert copy.poll() is None  # still asking
        copy.kill()
        copy.wait()
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
        if d.proc.poll() is None:
            d.stop()
