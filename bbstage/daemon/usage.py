"""What each job has written into its scratch, beside what it reserved (``capacity=``).

Slurm books a pool by the jobs' requests; nothing stops a job writing more into its
``$BB_SCRATCH`` but the file system's free space, which the pool's other jobs share. So the
daemon measures each active job's scratch every ``usage_interval`` seconds (the disk blocks
its files hold, a hard link counted once, walked in a thread, never across a mount, up to
``MOST`` entries) and shows it: ``bbstage status`` to the user, ``bbstage pools``, the
metrics and a warning in the log to the admin, once per job that goes over its capacity.
Nothing is bounded here: a site whose pool file system has project quotas (XFS, ext4,
Lustre) can bound each job's directory (docs/operations.md, "Scratch usage").
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from bbstage.daemon.state import JobRow

log = structlog.get_logger("bbstage.daemon.usage")
MOST = 1_000_000  # entries walked in one scratch: past it, the figure is a lower bound


@dataclass(frozen=True)
class Used:
    bytes: int
    complete: bool  # False: MOST entries walked, more not counted


def measure(root: Path, most: int = MOST) -> Used:
    """The disk blocks the files under ``root`` hold (each inode once; no link followed, no
    other file system entered)."""
    try:
        device = os.lstat(root).st_dev
    except OSError:
        return Used(0, True)
    seen: set[int] = set()
    total, entries, stack = 0, 0, [os.fspath(root)]
    while stack:
        try:
            listing = os.scandir(stack.pop())
        except OSError:  # removed meanwhile, or unreadable
            continue
        with listing:
            for entry in listing:
                entries += 1
                if entries > most:
                    return Used(total, False)
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_dev != device or st.st_ino in seen:
                    continue
                if st.st_nlink > 1:
                    seen.add(st.st_ino)
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
    return Used(total, True)


class Usage:
    """The last measure of each active job's scratch."""

    def __init__(self) -> None:
        self._by_job: dict[str, Used] = {}
        self._warned: set[str] = set()

    def of(self, job_id: str) -> Used | None:
        return self._by_job.get(job_id)

    def of_pools(self, jobs: dict[str, str]) -> dict[str, int]:
        """Bytes used per pool, given each measured job's pool (``jobs``: id -> pool)."""
        out: dict[str, int] = {}
        for job_id, used in self._by_job.items():
            if (pool := jobs.get(job_id)) is not None:
                out[pool] = out.get(pool, 0) + used.bytes
        return out

    def over(self, capacities: dict[str, int]) -> list[str]:
        """The measured jobs over their capacity (``capacities``: id -> bytes reserved)."""
        return [j for j, u in self._by_job.items() if u.bytes > capacities.get(j, u.bytes)]

    async def scan(self, active: list[JobRow]) -> None:
        """Measure the scratch of every ``active`` job that has one, in a thread."""
        jobs = [j for j in active if j.scratch]
        measured = {}
        for job in jobs:
            measured[job.job_id] = await asyncio.to_thread(measure, Path(job.scratch))
        self._by_job = measured
        for job in jobs:
            used = measured[job.job_id]
            if job.size and used.bytes > job.size and job.job_id not in self._warned:
                self._warned.add(job.job_id)
                log.warning("scratch over capacity", job_id=job.job_id, uid=job.uid,
                            pool=job.pool, used=used.bytes, capacity=job.size)  # fmt: skip
        self._warned &= set(measured)


async def forever(usage: Usage, active: Callable[[], list[JobRow]], interval: float) -> None:
    """Measure the ``active`` jobs' scratch every ``interval`` seconds (never if it is 0)."""
    while interval > 0:
        try:
            await usage.scan(await asyncio.to_thread(active))
        except Exception:  # a measure must never stop the daemon
            log.exception("scratch usage scan failed")
        await asyncio.sleep(interval)
