"""File modes the daemon keeps on what it writes (imports nothing of bbstage)."""

from __future__ import annotations

import os
from pathlib import Path


def private_database(path: Path) -> None:
    """The database and its ``-wal`` and ``-shm`` files are root's alone (0600) whatever
    the umask: they hold every user's paths and errors. A missing database is created so."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if name.exists():
            os.chmod(name, 0o600, follow_symlinks=False)
