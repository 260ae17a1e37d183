"""Stage-in verdicts the hooks read without a round trip to the daemon.

An empty file ``<directory>/<job id>`` says that the job's stage-in has finished. Slurm
22.05 calls data_in right after setup, which already started the stage-in, and 24.05+
polls test_data_in: both answer ``slurm.SUCCESS`` at once when the file is there, and ask
the daemon otherwise. Only the daemon (root) writes the directory (mode 0755, beside the
control socket, so Slurm's user can read it); a job's file goes when the job is set up
again or torn down, so it never outlives the stage-in it reports.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from bbstage.config import Config


def directory(config: Config) -> Path:
    return config.socket.parent / "staged"


def prepare(where: Path) -> None:
    """An empty directory only root can write (files a restart does not vouch for go)."""
    if where.is_symlink():
        where.unlink()
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True, mode=0o755)  # fails if anything is left in the way
    where.chmod(0o755)


def mark(where: Path, job_id: str) -> None:
    """The job's stage-in is done."""
    fd = os.open(where / job_id, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    os.close(fd)


def unmark(where: Path, job_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (where / job_id).unlink()
