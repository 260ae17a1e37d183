"""state.db, -wal and -shm are root's alone (audit #4): they hold every user's paths and
errors, so a readable database would undo "users see only their own jobs"."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from bbstage.cli import checks
from bbstage.config import Config, Pool
from tests.hookharness import area, script, start_daemon, user_ids

__all__ = ["area"]  # the fixture


def modes(state: Path) -> dict[str, str]:
    return {
        p.name: oct(stat.S_IMODE(p.stat().st_mode))
        for p in state.iterdir()
        if p.name.startswith("state.db")
    }


def test_the_state_files_are_0600_while_and_after_the_daemon_runs(area: Path) -> None:
    """Under umask 022, with a database an older version left 0644."""
    state = area / "daemon" / "state"
    state.mkdir(parents=True)
    old = os.umask(0o022)
    try:
        sqlite3.connect(state / "state.db").execute("PRAGMA journal_mode=WAL").fetchall()
        assert modes(state)["state.db"] == oct(0o644)
        daemon = start_daemon(area / "daemon")
    finally:
        os.umask(old)
    uid, gid = user_ids()
    job = script(area / "job.sh", "stage_in source=/etc/hostname destination=$BB_SCRATCH/h")
    assert daemon.hook("slurm_bb_setup", "401", str(uid), str(gid), "(null)", "0", job) == (0, "")
    assert daemon.hook("slurm_bb_data_in", "401", job) == (0, "")
    running = modes(state)
    assert set(running) == {"state.db", "state.db-wal", "state.db-shm"}
    assert set(running.values()) == {oct(0o600)}, running
    daemon.stop()
    assert set(modes(state).values()) == {oct(0o600)}


def test_config_check_warns_of_an_open_state_dir_and_a_pool_inside_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    pool = Pool("scratch", state / "scratch", 1 << 30)
    config = Config(socket=tmp_path / "run" / "control.sock", state_dir=state, pools=(pool,))
    found = [m for level, m in checks.findings(config) if level == checks.WARN]
    assert f"state_dir: {state} is 0o755, open to group or others: chmod 0700" in " ".join(found)
    assert any(f"{state / 'scratch'} is inside state_dir" in m for m in found)
    state.chmod(0o700)
    config = Config(socket=tmp_path / "run" / "control.sock", state_dir=state)
    assert not [m for level, m in checks.findings(config) if "state_dir" in m]
