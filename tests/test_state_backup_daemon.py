"""[V] An online backup of the state while the daemon stages, and a tested restore: the
backup taken under a running stage-in, the database then lost, the backup put back, and the
daemon started on it knows every job the backup held; a restore is refused while a daemon
runs, and for a damaged backup or one of a newer bbstage, leaving the database as it was."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from bbstage.daemon import schema

from .helpers import file_digest
from .hookharness import REPO, area, script, start_daemon, user_ids, user_tree  # noqa: F401


def state(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bbstage.cli.main", "--config", str(config), "state", *args],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_backup_under_staging_then_restore_after_the_database_is_lost(
    area: Path,  # noqa: F811
) -> None:
    uid, gid = user_ids()
    root = area / "daemon"
    d = start_daemon(root)
    data = area / "data"
    data.mkdir()
    (data / "big.dat").write_bytes(os.urandom(256 << 20))
    user_tree(data, uid, gid)
    (area / "out").mkdir()
    out = user_tree(area / "out", uid, gid)
    u, g = str(uid), str(gid)
    done = script(area / "done.sh", f"stage_in source={data}/big.dat destination={out}/a.dat")
    assert d.hook("slurm_bb_setup", "501", u, g, "(null)", "0", done)[0] == 0
    assert d.hook("slurm_bb_data_in", "501", done) == (0, "")
    # 24.05+'s flow: data_in starts the stage-in and returns; the backup is taken under it.
    busy = script(area / "busy.sh", f"stage_in source={data}/big.dat destination={out}/b.dat")
    assert d.hook("slurm_bb_setup", "502", u, g, "scratch", "0", busy, None)[0] == 0
    assert d.hook("slurm_bb_data_in", "502", busy, u, g, None)[0] == 0
    saved = area / "backup.db"
    taken = state(d.config, "backup", str(saved))
    assert taken.returncode == 0, taken.stderr
    assert f"schema version {schema.LATEST}, 2 jobs" in taken.stdout
    assert saved.stat().st_mode & 0o777 == 0o600
    # A restore while the daemon runs is refused, the database untouched.
    refused = state(d.config, "restore", str(saved))
    assert refused.returncode == 1 and "stop it first" in refused.stderr
    d.kill()  # the host's disk is lost with its state
    db = root / "state" / "state.db"
    for p in db.parent.glob("state.db*"):
        p.unlink()
    restored = state(d.config, "restore", str(saved))
    assert restored.returncode == 0, restored.stderr
    d = start_daemon(root)
    try:
        first = json.loads(d.cli("status", "--json", "501").stdout)
        assert first["state"] == "staged_in" and first["directives"][0]["state"] == "done"
        second = json.loads(d.cli("status", "--json", "502").stdout)
        assert second["directives"][0]["state"] in ("running", "pending", "done")
        # The job in flight at the backup is staged by the daemon started on it, whole.
        assert d.hook("slurm_bb_data_in", "502", busy) == (0, "")
        assert file_digest(out / "b.dat") == file_digest(data / "big.dat")
    finally:
        d.stop()


def test_a_damaged_or_newer_backup_is_refused_and_the_database_kept(
    area: Path,  # noqa: F811
) -> None:
    root = area / "daemon"
    d = start_daemon(root)
    d.stop()
    db = root / "state" / "state.db"
    before = digest(db)
    damaged = area / "damaged.db"
    damaged.write_bytes(db.read_bytes()[:4096] + b"\0" * 4096)
    out = state(d.config, "restore", str(damaged))
    assert out.returncode == 1 and str(damaged) in out.stderr
    newer = area / "newer.db"
    newer.write_bytes(db.read_bytes())
    con = sqlite3.connect(newer)
    con.execute("INSERT INTO schema_migrations VALUES (?, 'future', 0, '9')", (schema.LATEST + 1,))
    con.commit()
    con.close()
    out = state(d.config, "restore", str(newer))
    assert out.returncode == 1 and "a newer bbstage wrote it" in out.stderr
    assert digest(db) == before
    version = state(d.config, "version")
    assert f"schema version {schema.LATEST}" in version.stdout
