"""An online backup of the state database and its restore (``bbstage state``).

The backup is SQLite's own online backup (a consistent copy while the daemon writes, WAL
readers never block it), written under a temporary name and renamed when complete, root's
alone. A restore puts a backup back while no daemon runs (its lock on the state directory
tells): the backup is checked first (SQLite's integrity check, a schema this bbstage knows),
the current database is moved aside, never deleted, and the backup renamed into place.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from bbstage.daemon import schema, service
from bbstage.modes import private_database


class BackupError(Exception):
    """A backup or restore that could not be done: names the file and what to do."""


def database(state_dir: Path) -> Path:
    return state_dir / "state.db"


def describe(path: Path) -> str:
    """``schema version N, J jobs`` of a database (read only)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        jobs = db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
        return f"schema version {schema.version(db)}, {jobs} jobs"
    except sqlite3.Error as exc:
        raise BackupError(f"{path}: not a bbstage state database ({exc})") from None
    finally:
        db.close()


def backup(state_dir: Path, dest: Path) -> str:
    """Copy the state database to ``dest`` (the daemon may run); what was copied."""
    source = database(state_dir)
    if not source.exists():
        raise BackupError(f"{source}: no state database here (see [daemon] state_dir)")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    private_database(tmp)
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
        out = sqlite3.connect(tmp)
        try:
            src.backup(out)
        finally:
            out.close()
            src.close()
        os.replace(tmp, dest)
    except (OSError, sqlite3.Error) as exc:
        tmp.unlink(missing_ok=True)
        raise BackupError(f"backup of {source} to {dest} failed: {exc}") from None
    return describe(dest)


def restore(state_dir: Path, backup_file: Path) -> tuple[str, Path | None]:
    """Put ``backup_file`` back as the state database (no daemon may run); what was restored
    and where the database it replaced was moved."""
    try:
        fd = service.lock_state_dir(state_dir)
    except service.AlreadyRunning as exc:
        raise BackupError(f"{exc} (systemctl stop bbstage), then restore") from None
    try:
        check = sqlite3.connect(f"file:{backup_file}?mode=ro", uri=True)
        try:
            ok = check.execute("PRAGMA integrity_check").fetchone()[0]
            schema.check(check, backup_file)
        except sqlite3.Error as exc:
            raise BackupError(f"{backup_file}: not a bbstage state database ({exc})") from None
        except schema.NewerSchema as exc:
            raise BackupError(str(exc)) from None
        finally:
            check.close()
        if ok != "ok":
            raise BackupError(f"{backup_file}: damaged ({ok}): take another backup")
        what = describe(backup_file)
        target = database(state_dir)
        aside = None
        if target.exists():
            aside = target.with_name(f"state.db.before-restore-{time.strftime('%Y%m%dT%H%M%S')}")
            os.replace(target, aside)
        for suffix in ("-wal", "-shm"):  # go with the database they belong to
            old = target.with_name(target.name + suffix)
            if old.exists():
                if aside is not None:
                    os.replace(old, aside.with_name(aside.name + suffix))
                else:
                    old.unlink()
        tmp = target.with_name(".state.db.restore.tmp")
        private_database(tmp)
        with open(backup_file, "rb") as src, open(tmp, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
        return what, aside
    finally:
        os.close(fd)
