"""The running transfers of the engine: started (or joined) on the executor, their events
kept, their attempts on transfer nodes recorded, their progress saved, their end decided
(``lifecycle.transfer_ended``: tried again, done, failed) and cancelled.

What a transfer's end asks for is carried out by the engine (``Engine._do``, given here as
``do``), as every decision of the lifecycle is.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from bbstage.config import Config
from bbstage.daemon import lifecycle, scratch
from bbstage.daemon.contracts import Executor
from bbstage.daemon.lifecycle import ATTEMPTS, Action, Ended, Refused
from bbstage.daemon.state import AttemptState, DirectiveRow, DirectiveState, JobRow, Store
from bbstage.identity import Identity
from bbstage.movers import TransferError
from bbstage.movers.counts import clamp
from bbstage.transfer import (
    AttemptUpdate,
    Done,
    Event,
    Moved,
    Planned,
    ScratchLimit,
    TransferSpec,
)

log = structlog.get_logger("bbstage.daemon.transfers")

PROGRESS_EVERY = 1.0  # seconds between saves of the running transfers' progress


@dataclass
class Running:
    """One running transfer (a directive's, or an in-job copy's): its future, and what the
    engine keeps of it until it ends. ``counts`` and ``attempts`` are written in the
    executor's thread (each a whole new value, or one dict item: atomic), read on the loop."""

    tries: int = 1  # which try this is (a transient failure starts the next, up to ATTEMPTS)
    future: asyncio.Future[Done] = field(init=False, repr=False)  # set once submitted
    # The latest plan/progress counts (Planned, Moved), saved by record_progress.
    counts: dict[str, int] = field(default_factory=dict)
    final: bool = False  # its walk ended: the counts are the plan
    # Its attempts on transfer nodes (Dask) still running: their latest update, by id.
    attempts: dict[str, AttemptUpdate] = field(default_factory=dict)


class Transfers:
    """The transfers running, by (job id, directive index)."""

    def __init__(
        self,
        config: Config,
        store: Store,
        executor: Executor,
        do: Callable[[Sequence[Action]], object],
        tearing: set[str],
    ) -> None:
        self.config, self.store, self.executor = config, store, executor
        self._do = do  # carries out a decision's actions (``Engine._do``)
        self._tearing = tearing  # jobs whose teardown decides their end: not settled here
        self.running: dict[tuple[str, int], Running] = {}
        # Each job's place in its user's queue (the executor's fair share), from the hooks.
        self.order: dict[str, tuple[float, float]] = {}
        self.stopping = False

    def of(self, job: JobRow) -> frozenset[int]:
        """The indexes of ``job``'s directives whose transfer runs."""
        return frozenset(d.idx for d in job.directives if (job.job_id, d.idx) in self.running)

    async def stop(self) -> None:
        """Stop every transfer for a shutdown: none is recorded as ended (``_record_end``)."""
        self.stopping = True
        await asyncio.to_thread(self.executor.shutdown)

    def start(self, job: JobRow, d: DirectiveRow, tries: int = 1) -> asyncio.Future[Done]:
        """Start a directive's transfer (its ``tries``-th try), or join the one running."""
        key = (job.job_id, d.idx)
        if key in self.running:
            return self.running[key].future
        assert job.uid is not None and job.gid is not None
        identity = Identity.of(job.uid, job.gid)
        # An earlier attempt (before a restart, or killed) may have left temporary files.
        try:
            spec = self.spec(job, d).but(resumed=d.started is not None)
        except (ValueError, TransferError) as exc:  # no scratch for $BB_SCRATCH, no backend
            raise Refused(str(exc)) from None
        self.store.set_directive(
            job.job_id, d.idx, state=DirectiveState.RUNNING, error="", started=time.time()
        )
        order = self.order.get(job.job_id, (math.inf, 0.0))
        run = Running(tries)

        def on_event(event: Event | AttemptUpdate) -> None:  # in the executor's thread
            self._on_event(job.job_id, d.idx, run, event)

        cf = self.executor.submit(f"{job.job_id}:{d.idx}", spec, identity, on_event, order=order)
        run.future = asyncio.wrap_future(cf)
        self.running[key] = run
        run.future.add_done_callback(lambda f: self._finished(job.job_id, d, run))
        log.debug("transfer started", job_id=job.job_id, directive=d.idx, verb=d.verb)
        return run.future

    async def cancel(self, job_id: str, idx: int) -> None:
        """Stop a transfer (it is not tried again) and wait for its end to be recorded."""
        run = self.running.get((job_id, idx))
        if run is not None:
            run.tries = ATTEMPTS  # a cancelled transfer is not tried again
        await asyncio.to_thread(self.executor.cancel, f"{job_id}:{idx}")
        if run is not None:
            await asyncio.wait([run.future])

    def spec(self, job: JobRow, d: DirectiveRow) -> TransferSpec:
        """A directive's transfer spec, ``$BB_SCRATCH`` resolved: ``TransferSpec.of_directive``."""
        spec = d.spec
        resolved = {
            **spec,
            "source": scratch.resolve(spec["source"], job.scratch),
            "destination": scratch.resolve(spec["destination"], job.scratch),
        }
        return TransferSpec.of_directive(
            job.job_id,
            resolved,
            uid=job.uid or 0,
            backend_settings=self.config.backend_settings,
            threads=self.config.threads_per_transfer,
            chunk_size=self.config.chunk_size,
            scratch_limit=_scratch_limit(job, spec),
        )

    # -- in the executor's thread ---------------------------------------------------------

    def _on_event(self, job_id: str, idx: int, run: Running, event: Event | AttemptUpdate) -> None:
        """A running transfer's event (in the executor's thread): its counts kept for
        ``record_progress`` (within what SQLite stores: the Dask executor sums its shards'
        in root), an attempt on a transfer node recorded."""
        if isinstance(event, AttemptUpdate):
            event = replace(event, bytes=clamp(event.bytes), files=clamp(event.files))
            self._attempt(job_id, idx, run, event)
        elif isinstance(event, Planned):  # the counts so far while walking, then final
            run.counts = {**run.counts, "bytes_total": clamp(event.bytes),
                          "files_total": clamp(event.files),
                          "files_skipped": clamp(event.skipped)}  # fmt: skip
            run.final = run.final or event.final
        elif isinstance(event, Moved):
            run.counts = {**run.counts, "bytes_done": clamp(event.bytes),
                          "files_done": clamp(event.files)}  # fmt: skip

    def _attempt(self, job_id: str, idx: int, run: Running, update: AttemptUpdate) -> None:
        """An attempt on a transfer node (in the executor's thread): recorded at its first
        update, which comes before the executor submits it; its progress kept for
        ``record_progress``; its end recorded at once."""
        if update.state != AttemptState.RUNNING:
            run.attempts.pop(update.id, None)
            self.store.end_attempt(
                update.id, update.state, update.node, update.bytes, update.files, update.error
            )
        elif update.id in run.attempts:
            run.attempts[update.id] = update
        else:
            self.store.add_attempt(job_id, idx, update.id, update.shard, update.shards)
            run.attempts[update.id] = update

    # -- its end ------------------------------------------------------------------------------

    def _finished(self, job_id: str, d: DirectiveRow, run: Running) -> None:
        """Record a transfer's outcome (``_record_end``). Should that fail (a count the state
        cannot hold, a database error), the directive is failed with the reason instead of
        staying ``running`` for ever, and the job settled."""
        try:
            self._record_end(job_id, d, run)
        except Exception as exc:
            log.exception("transfer outcome not recorded", job_id=job_id, directive=d.idx)
            if (job_id, d.idx) in self.running:  # a new attempt started: it will record
                return
            error = f"internal error while recording the transfer's end: {exc!r}"
            try:
                self.store.set_directive(job_id, d.idx, state=DirectiveState.FAILED, error=error,
                                         finished=time.time())  # fmt: skip
                job = self.store.job(job_id)
                self._do(lifecycle.settle(job, d.verb, job_id in self._tearing).actions)
            except Exception:
                log.exception("transfer failure not recorded", job_id=job_id, directive=d.idx)

    def _record_end(self, job_id: str, d: DirectiveRow, run: Running) -> None:
        """Record a transfer's outcome (``lifecycle.transfer_ended``); a shutdown records
        nothing (resumed later)."""
        key, future, counts = (job_id, d.idx), run.future, run.counts
        if self.running.get(key) is run:
            del self.running[key]
        # What the worker promised (its final Planned event: its walk ended), if it got
        # that far; the counts of a walk still under way are no plan.
        plan = Planned(counts["bytes_total"], counts["files_total"]) if run.final else None
        if future.cancelled() or (self.stopping and future.exception() is not None):
            log.info("transfer interrupted, resumes on start", job_id=job_id, directive=d.idx)
            return
        outcome: Done | BaseException = future.exception() or future.result()
        end = Ended(job_id, d.idx, d.verb, outcome, plan, counts, run.tries, time.time())
        decision = lifecycle.transfer_ended(self.store.job(job_id), end, job_id in self._tearing)
        self._do(decision.actions)

    # -- progress -----------------------------------------------------------------------------

    async def record_progress(self) -> None:
        """Every ``PROGRESS_EVERY`` seconds, save the running transfers' counts, and their
        attempts' on transfer nodes (the worker reports them several times a second; the
        last ones are saved as a transfer or attempt ends)."""
        written: dict[tuple[str, int], dict[str, int]] = {}
        saved: dict[str, AttemptUpdate] = {}
        while True:
            await asyncio.sleep(PROGRESS_EVERY)
            for (job_id, idx), run in list(self.running.items()):
                counts = run.counts
                if counts and written.get((job_id, idx)) is not counts:
                    written[(job_id, idx)] = counts  # tried once: a bad one is not retried
                    try:
                        self.store.set_directive(job_id, idx, **counts)
                    except Exception:  # one bad record must not stop everyone's progress
                        log.exception("progress not saved", job_id=job_id, directive=idx)
            written = {k: v for k, v in written.items() if k in self.running}
            try:
                saved = self._save_attempts(saved)
            except Exception:
                saved = self._moving()  # not tried again until they change
                log.exception("attempts' progress not saved")

    def _moving(self) -> dict[str, AttemptUpdate]:
        """The running attempts on transfer nodes (Dask): their latest update, by id."""
        return {i: u for run in list(self.running.values()) for i, u in dict(run.attempts).items()}

    def _save_attempts(self, saved: dict[str, AttemptUpdate]) -> dict[str, AttemptUpdate]:
        """Save the running attempts' updates not ``saved`` yet (one transaction); the
        updates saved now."""
        moving = self._moving()
        changed = [u for u in moving.values() if saved.get(u.id) is not u]
        if changed:
            self.store.attempt_progress([(u.id, u.node, u.bytes, u.files) for u in changed])
        return moving


def _scratch_limit(job: JobRow, spec: dict[str, Any]) -> ScratchLimit | None:
    """Staging into scratch may use at most the job's ``capacity=`` (when it asked for one)."""
    if spec.get("destination_kind") != "scratch" or not job.size or not job.scratch:
        return None
    return ScratchLimit(job.scratch, job.size)
