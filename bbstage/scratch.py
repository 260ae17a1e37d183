"""Per-job scratch space in a pool: ``<pool root>/<job id>``, owned by the job's user, 0700."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from bbstage.config import Pool

PREFIX = "$BB_SCRATCH"


def job_dir(pool: Pool, job_id: str) -> Path:
    return pool.root / job_id


def create(pool: Pool, job_id: str, uid: int, gid: int) -> Path:
    """Create (or keep) the job's scratch directory; the pool root itself stays root's."""
    pool.root.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = job_dir(pool, job_id)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if path.is_symlink() or not path.is_dir():
            raise RuntimeError(f"scratch path {path} exists and is not a directory") from None
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, 0o700)
    return path


def set_aside(pool: Pool, job_id: str) -> Path:
    """Rename the job's scratch directory out of the way of a new job with the same id
    (``<id>.kept-<time>``), keeping what it holds; the new name."""
    kept = pool.root / f"{job_id}.kept-{int(time.time())}"
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
