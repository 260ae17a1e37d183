"""The ends of jobs, and what they leave: a job's teardown (its transfers stopped, its
scratch removed unless it holds results: ``lifecycle.keep_scratch``), the record of a reused
job id set aside, the records expired after ``retention_days``, and the sweep of the
temporary files of a job the daemon has no record of (``leftovers.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from bbstage.config import Config
from bbstage.daemon import leftovers, lifecycle, scratch, staged
from bbstage.daemon.lifecycle import COPY, Action
from bbstage.daemon.state import FINISHED, UNFINISHED, JobRow, Store
from bbstage.daemon.transfers import Transfers
from bbstage.protocol import Request

log = structlog.get_logger("bbstage.daemon.cleanup")


class Cleanup:
    def __init__(
        self,
        config: Config,
        store: Store,
        transfers: Transfers,
        do: Callable[[Sequence[Action]], object],
        marks: Path,
        tearing: set[str],
    ) -> None:
        self.config, self.store, self.transfers = config, store, transfers
        self._do = do  # carries out a decision's actions (``Engine._do``)
        self._staged = marks  # the stage-in marks' directory (``staged.py``)
        self._tearing = tearing  # jobs whose teardown is deciding their end
        self.sweeps = leftovers.Pace()  # sweeps of jobs unknown here, paced per job

    async def end_job(self, job_id: str, hurry: bool) -> None:
        """Tear a job down: Slurm's teardown hook, or (``bbstage.daemon.reconcile``, in a ``hurry``)
        for a job Slurm no longer runs. In-job copies finish first unless ``hurry``, which
        cancels every transfer; the scratch goes unless it holds results."""
        staged.unmark(self._staged, job_id)
        self.transfers.order.pop(job_id, None)
        job = self.store.job(job_id)
        if job is None:
            return
        running = self.transfers.running
        copies = [r.future for d in job.directives if d.verb == COPY
                  and (r := running.get((job.job_id, d.idx))) is not None]  # fmt: skip
        if copies and not hurry:  # outputs: they finish before the scratch goes
            log.info("teardown waits for in-job copies", job_id=job.job_id, copies=len(copies))
            await asyncio.wait(copies)
            job = self.store.job(job_id) or job
        # From here the teardown decides the job's end: the transfers it cancels do not
        # settle their phase (``lifecycle.settle``).
        self._tearing.add(job_id)
        try:
            await self._tear_down(job, hurry)
        finally:
            self._tearing.discard(job_id)

    async def _tear_down(self, job: JobRow, hurry: bool) -> None:
        """Stop the transfers of ``job`` (``hurry``), remove its scratch unless it holds
        results, and end it (from what ``job`` says: the transfers' state before it)."""
        cancelled = [d for d in job.directives if d.state in UNFINISHED]
        if hurry and cancelled:
            await asyncio.gather(*(self.transfers.cancel(job.job_id, d.idx) for d in cancelled))
            log.info(
                "transfers cancelled", job_id=job.job_id, directives=[d.idx for d in cancelled]
            )
        pool = self.config.pool(job.pool)
        current = self.store.job(job.job_id) or job  # as it is now, not as ``job`` was read
        kept = lifecycle.keep_scratch(job, current, self.config.retention_days)
        if kept is not None:
            self._do(kept.actions)
            return
        if pool is not None:
            await asyncio.to_thread(scratch.remove, pool, job.job_id)
        # The job as it is now: while this teardown awaited, another (Slurm's teardown
        # hook beside the reconciler's) may have ended it.
        now = self.store.job(job.job_id) or job
        self._do(lifecycle.end(now, hurry).actions)

    async def forget_stale(self, job: JobRow) -> None:
        """A new job reuses the id of an unfinished record (Slurm's job ids started again, or
        a teardown was lost): stop the old transfers, set aside a scratch that still holds
        results (``<pool>/<id>.kept-<time>``), and let the new job have the id."""
        log.warning("job id reused: the unfinished earlier record is replaced", job_id=job.job_id,
                    old_uid=job.uid, old_state=job.state)  # fmt: skip
        running = [d for d in job.directives if (job.job_id, d.idx) in self.transfers.running]
        await asyncio.gather(*(self.transfers.cancel(job.job_id, d.idx) for d in running))
        pool = self.config.pool(job.pool)
        if pool is not None and job.scratch:
            if lifecycle.outputs_at_risk(job):
                kept = await asyncio.to_thread(scratch.set_aside, pool, job.job_id)
                log.warning("scratch kept", job_id=job.job_id, scratch=str(kept))
            else:
                await asyncio.to_thread(scratch.remove, pool, job.job_id)

    async def purge_expired(self) -> None:
        """Forget jobs finished longer than ``retention_days`` ago, and any scratch they kept."""
        cutoff = time.time() - self.config.retention_days * 86400
        for job_id, pool_name in self.store.finished_before(cutoff, FINISHED):
            pool = self.config.pool(pool_name)
            job = self.store.job(job_id)
            if pool is not None and job is not None and job.origin == "setup":
                await asyncio.to_thread(scratch.remove, pool, job_id)
            staged.unmark(self._staged, job_id)
            self.store.delete_job(job_id)

    async def sweep_lost(self, req: Request) -> None:
        """A job the daemon has no record of (its state was lost, or setup refused it): no
        record of what its workers wrote either, so the script (``script``, or Slurm's copy
        at ``script_path``) says where their temporary files may be
        (bbstage/daemon/leftovers.py)."""
        script = req.get("script")
        if not script and not req.get("script_path"):
            return
        if not self.sweeps.due(req.job_id):  # a poll of test_data_in: swept lately
            return
        if not script:
            script = await asyncio.to_thread(leftovers.read, req.get("script_path"), req.job_id)
        if script:
            uid = str(req.get("uid", ""))  # 24.05+: the job's owner; only their files go
            owner = int(uid) if uid.isascii() and uid.isdigit() else None
            await asyncio.to_thread(
                leftovers.sweep, script, req.job_id, self.config.registry, owner
            )
