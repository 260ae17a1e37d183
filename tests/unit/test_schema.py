"""[V] The state database's schema version: migrations applied once and in order, a 0.2.0
database (which kept no version) adopted as it is, and a database of a newer bbstage refused
before anything is written."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bbstage.daemon import schema
from bbstage.daemon.state import JobState, Store

REPO = Path(__file__).resolve().parents[2]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_new_database_gets_every_migration_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.close()
    db = sqlite3.connect(tmp_path / "state.db")
    rows = db.execute("SELECT version, bbstage FROM schema_migrations").fetchall()
    assert [v for v, _ in rows] == [m.version for m in schema.MIGRATIONS]
    assert schema.migrate(db, "x") == []  # nothing twice
    assert schema.version(db) == schema.LATEST


def test_a_database_of_0_2_0_is_adopted_with_its_jobs(tmp_path: Path) -> None:
    """0.2.0 kept no version: its tables are there, the row of migration 1 is added."""
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.executescript(schema.MIGRATIONS[0].sql)
    db.execute("INSERT INTO jobs (job_id, state, created, updated) VALUES ('7', 'done', 1, 1)")
    db.commit()
    db.close()
    store = Store(path)
    assert store.job("7").state == JobState.DONE
    store.close()
    assert schema.version(sqlite3.connect(path)) == schema.LATEST


def test_a_database_from_before_0_2_gets_its_missing_columns(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    old = schema.MIGRATIONS[0].sql.replace(",\n    origin TEXT NOT NULL DEFAULT 'setup'", "")
    db.executescript(old.replace("    files_skipped INTEGER NOT NULL DEFAULT 0,\n", ""))
    db.execute("INSERT INTO jobs (job_id, state, created, updated) VALUES ('8', 'done', 1, 1)")
    db.commit()
    db.close()
    store = Store(path)
    job = store.job("8")
    assert job.origin == "setup"
    store.close()


def newer(path: Path) -> None:
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO schema_migrations VALUES (?, 'from the future', 0, '9.9.9')",
               (schema.LATEST + 1,))  # fmt: skip
    db.commit()
    db.close()


def test_a_newer_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    newer(path)
    before = {p.name: digest(p) for p in tmp_path.iterdir()}
    with pytest.raises(schema.NewerSchema, match=rf"schema version {schema.LATEST + 1}.*"
                       "Nothing was changed"):  # fmt: skip
        Store(path)
    assert {p.name: digest(p) for p in tmp_path.iterdir()} == before


def test_the_daemon_will_not_start_on_a_newer_database(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    newer(tmp_path / "state" / "state.db")
    config = tmp_path / "bbstage.toml"
    config.write_text(
        f'[daemon]\nsocket = "{tmp_path}/c.sock"\nuser_socket = "{tmp_path}/u.sock"\n'
        f'state_dir = "{tmp_path}/state"\nmetrics_address = ""\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "bbstage.cli.main", "--config", str(config), "daemon"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 1
    assert "a newer bbstage wrote it. Nothing was changed" in out.stderr
    assert "Traceback" not in out.stderr
