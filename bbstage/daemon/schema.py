"""The state database's schema: numbered migrations, applied in order, each once.

A table ``schema_migrations`` holds a row per migration applied (its number, its name, when,
and by which bbstage). A daemon brings its database up to the newest migration it knows,
in one transaction, at start; it refuses a database that has migrations it does not know
(written by a newer bbstage), before it changes anything, so an older daemon started by
mistake after an upgrade leaves the newer one's state as it was. Going back is the backup
taken before the upgrade plus the previous package (docs/operations.md, "Upgrades"):
migrations have no "down", which would lose what the newer schema keeps anyway.

A migration is SQL; every engine the daemon stores its state in runs the same list.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import bbstage


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


# 1: the schema of bbstage 0.2.0, the first release (which kept no version: a database it
# wrote has these tables and gets the row alone).
_JOBS = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    uid INTEGER, gid INTEGER,
    pool TEXT, size INTEGER, scratch TEXT,
    state TEXT NOT NULL,
    error TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL, updated REAL NOT NULL,
    origin TEXT NOT NULL DEFAULT 'setup'
);
CREATE TABLE IF NOT EXISTS directives (
    job_id TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    line INTEGER NOT NULL,
    verb TEXT NOT NULL,
    source TEXT NOT NULL, destination TEXT NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    bytes_done INTEGER NOT NULL DEFAULT 0, bytes_total INTEGER NOT NULL DEFAULT 0,
    files_done INTEGER NOT NULL DEFAULT 0, files_total INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    started REAL, finished REAL,
    files_skipped INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, idx)
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state);
CREATE TABLE IF NOT EXISTS attempts (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    shard INTEGER NOT NULL, shards INTEGER NOT NULL,
    node TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL DEFAULT 'running',
    bytes INTEGER NOT NULL DEFAULT 0, files INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '',
    started REAL NOT NULL, ended REAL,
    FOREIGN KEY (job_id, idx) REFERENCES directives (job_id, idx) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS attempts_by_directive ON attempts (job_id, idx)
"""

MIGRATIONS = (Migration(1, "jobs, directives and attempts (0.2.0)", _JOBS),)
LATEST = MIGRATIONS[-1].version

_TABLE = """CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied REAL NOT NULL,
    bbstage TEXT NOT NULL)"""
# Columns a database from before 0.2.0 (a checkout's) may lack: (table, column, type).
_BEFORE_0_2 = [
    ("jobs", "origin", "TEXT NOT NULL DEFAULT 'setup'"),
    ("directives", "files_skipped", "INTEGER NOT NULL DEFAULT 0"),
]


class NewerSchema(Exception):
    """The database has migrations this bbstage does not know: a newer one wrote it."""


def version(db: sqlite3.Connection) -> int:
    """The newest migration applied (0: none, a new database or one of 0.2.0)."""
    found = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if not found:
        return 0
    return db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0]


def check(db: sqlite3.Connection, where: Path | str) -> int:
    """The database's version; NewerSchema, before anything is written, if it is newer."""
    have = version(db)
    if have > LATEST:
        raise NewerSchema(
            f"{where}: the state database is at schema version {have}, and bbstage"
            f" {bbstage.__version__} knows versions up to {LATEST}: a newer bbstage wrote it."
            " Nothing was changed. Install that newer bbstage again, or restore the backup"
            " taken before the upgrade (docs/operations.md, Upgrades)"
        )
    return have


def migrate(db: sqlite3.Connection, where: Path | str) -> list[int]:
    """Apply the migrations the database lacks, in one transaction; the versions applied."""
    db.execute("BEGIN IMMEDIATE")
    try:
        have = check(db, where)
        pending = [m for m in MIGRATIONS if m.version > have]
        if pending:
            db.execute(_TABLE)
        for migration in pending:
            for statement in filter(str.strip, migration.sql.split(";")):
                db.execute(statement)
            if migration.version == 1:
                _add_columns_of_0_2(db)
            db.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, ?, ?)",
                (migration.version, migration.name, time.time(), bbstage.__version__),
            )
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return [m.version for m in pending]


def _add_columns_of_0_2(db: sqlite3.Connection) -> None:
    for table, column, kind in _BEFORE_0_2:
        if column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
