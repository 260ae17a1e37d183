"""Per-job scratch space in a pool: ``<pool root>/<job id>``, owned by the job's user, 0700."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

import structlog

from bbstage.config import Pool

log = structlog.get_logger("bbstage.daemon.scratch")

PREFIX = "$BB_SCRATCH"


def job_dir(pool: Pool, job_id: str) -> Path:
    return pool.root / job_id


def create(pool: Pool, job_id: str, uid: int, gid: int, *, recovered: bool = False) -> Path:
    """Create the job's scratch directory; the pool root itself stays root's.

    A directory already there is never handed to a new job: it is another job's that had
    this id (the kept results of a failed stage-out, or one left by a lost state, perhaps
    another user's), so it is set aside (``set_aside``, logged) and a fresh one made. Only a
    job ``recovered`` after the daemon lost its state takes back a directory its own user
    owns: its own results, which its stage-out is about to copy."""
    pool.root.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = job_dir(pool, job_id)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise RuntimeError(f"scratch path {path} exists and is not a directory") from None
        if not (recovered and st.st_uid == uid):
            kept = set_aside(pool, job_id)
            log.warning("scratch of an earlier job with this id set aside", job_id=job_id,
                        kept=str(kept), owner=st.st_uid, new_owner=uid)  # fmt: skip
            os.mkdir(path, 0o700)
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, 0o700)
    return path


def set_aside(pool: Pool, job_id: str) -> Path:
    """Rename the job's scratch directory out of the way of a new job with the same id
    (``<id>.kept-<time>``, out of the job ids' names), keeping what it holds and its owner;
    the new name. (Only root writes the pool root: no one races for the name.)"""
    stamp = int(time.time())
    kept = pool.root / f"{job_id}.kept-{stamp}"
    n = 0
    while os.path.lexists(kept):
        n += 1
        kept = pool.root / f"{job_id}.kept-{stamp}.{n}"
    os.rename(job_dir(pool, job_id), kept)
    return kept


def remove(pool: Pool, job_id: str) -> None:
    """Remove the job's scratch directory (``shutil.rmtree`` never follows symlinks)."""
    shutil.rmtree(job_dir(pool, job_id), ignore_errors=True)


def resolve(location: str, scratch: str | None) -> str:
    """``$BB_SCRATCH/sub/path`` → ``<scratch>/sub/path``; other locations are unchanged."""
    if not location.startswith(PREFIX):
        return location
    if not scratch:
        raise ValueError(f"{location}: this job has no scratch space (no pool is configured)")
    return scratch + location[len(PREFIX) :]


def in_use(pools: tuple[Pool, ...], reserved: dict[str, int]) -> dict[str, dict[str, int]]:
    """Capacity and reservations per pool, for `bbstage pools` and ``slurm_bb_pools``."""
    return {
        p.name: {
            "capacity": p.capacity,
            "granularity": p.granularity,
            "reserved": reserved.get(p.name, 0),
            "free": max(0, p.capacity - reserved.get(p.name, 0)),
        }
        for p in pools
    }
