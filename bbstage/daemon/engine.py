"""The staging engine: one state machine per job, driven by the Slurm hooks' requests.

Every request is idempotent, keyed by (job id, hook, directive index): a hook that Slurm
re-runs, or that re-sends after a daemon restart, joins the work already under way or gets
the result already recorded.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from bbstage import directives
from bbstage.config import Config
from bbstage.counts import clamp
from bbstage.daemon import leftovers, report, scratch, slurmdirs, staged
from bbstage.daemon.contracts import Executor
from bbstage.daemon.events import EngineEvent, HookAnswered, TransferEnded
from bbstage.daemon.state import (
    FINISHED,
    UNFINISHED,
    AttemptRow,
    AttemptState,
    DirectiveRow,
    DirectiveState,
    JobRow,
    JobState,
    Store,
)
from bbstage.identity import Identity, IdentityError
from bbstage.movers import Cancelled, TransferError
from bbstage.protocol import BUSY, ERROR, OK, ProtocolError, Reply, Request, bounded
from bbstage.transfer import (
    AttemptUpdate,
    Done,
    Event,
    Moved,
    Planned,
    ScratchLimit,
    TransferSpec,
    retrying,
)

log = structlog.get_logger("bbstage.daemon.engine")

PROGRESS_EVERY = 1.0  # seconds between saves of the running transfers' progress
ATTEMPTS = retrying.TRANSFER.tries  # a transfer that fails transiently is run again
_PHASE = {
    "stage_in": (JobState.STAGING_IN, JobState.STAGED_IN),
    "stage_out": (JobState.STAGING_OUT, JobState.STAGED_OUT),
}
_LIFECYCLE = list(JobState)  # in order (JobState's): a phase is entered from before it only
# An in-job copy (`bbstage copy`, no --at-end) is a directive of this verb, added while the job
# runs; it is one of the job's outputs: its stage-out waits for it (``_of_phase``). A copy
# --at-end is a plain stage_out added at run time.
COPY = "copy"
MAX_JOB_DIRECTIVES = 1024  # a script's directives and its in-job copies together


class Refused(Exception):
    """A request the engine answers "no" to, with the reason for whoever sent it (a script's
    error, an unknown pool, a job not running...). Not a ``ValueError``: any other exception
    in a handler is a bug in the daemon, and is answered as one (``handle``)."""


def internal_error(exc: BaseException, op: str, job_id: object) -> str:
    """The answer to a request that met a bug in the daemon (an unexpected exception): not
    the job's fault, and where its traceback is (logged by the caller, with ``op``)."""
    return (
        f"staging daemon internal error ({type(exc).__name__}): a bug in bbstage, not a problem"
        f" with the job; the traceback is in the daemon's log (journalctl -u bbstage:"
        f" {op}, job {job_id})"
    )


@dataclass
class _Running:
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


class Engine:
    def __init__(self, config: Config, store: Store, executor: Executor) -> None:
        self.config, self.store, self.executor = config, store, executor
        self._staged = staged.directory(config)
        staged.prepare(self._staged)
        self._running: dict[tuple[str, int], _Running] = {}  # by (job id, directive index)
        # Each job's place in its user's queue (the executor's fair share), from the hooks.
        self._order: dict[str, tuple[float, float]] = {}
        self._sweeps = leftovers.Pace()  # sweeps of jobs unknown here, paced per job
        self._tearing: set[str] = set()  # jobs whose teardown is deciding their end
        self._stopping = False
        self._listeners: list[Callable[[EngineEvent], None]] = []
        self._ops: dict[str, Callable[[Request], Awaitable[Reply]]] = {
            "setup": self.setup,
            "data_in": self.data_in,
            "test_data_in": self.test_data_in,
            "real_size": self.real_size,
            "pre_run": self.pre_run,
            "post_run": self.post_run,
            "data_out": self.data_out,
            "test_data_out": self.test_data_out,
            "teardown": self.teardown,
            "get_status": self.get_status,
        }

    async def handle(self, request: Request) -> Reply:
        """Answer one hook; log one line for it: who asked (which hooks carry the owner:
        all on 24.05+, setup only on 22.05), the verdict, and how long it took."""
        started = time.perf_counter()
        try:
            if request.op in ("setup", "data_in", "data_out"):
                self._order[request.job_id] = _order_of(request)
            reply = await self._ops[request.op](request)
        except (Refused, IdentityError) as exc:
            reply = Reply.error(str(exc))
        except ProtocolError as exc:  # the request's own fault (a job id that is no number)
            reply = Reply.error(f"bad request: {exc}")
        except Exception as exc:  # a bug: never answered as if the job were at fault
            job_id = request.get("job_id")
            log.exception("hook failed: internal error", hook=request.op, job_id=job_id)
            reply = Reply.error(internal_error(exc, request.op, job_id))
        seconds = time.perf_counter() - started
        log.info(
            "hook",
            hook=request.op,
            job_id=request.get("job_id"),
            uid=request.get("uid"),
            status=reply.status,
            message=reply.message,
            ms=round(seconds * 1000, 2),
        )
        self._emit(HookAnswered(request.op, reply.status, seconds))
        return reply

    def subscribe(self, listener: Callable[[EngineEvent], None]) -> None:
        """Call ``listener`` with every event from now on (bbstage/daemon/events.py)."""
        self._listeners.append(listener)

    def _emit(self, event: EngineEvent) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a subscriber's bug must not change what the engine does
                log.exception("event listener failed", listener=repr(listener))

    async def stop(self) -> None:
        """Stop every transfer for a shutdown. What they stopped in the middle stays
        ``running`` in the state (the files already committed stay in place) and resumes on
        the next start: a transfer stopped by a shutdown is never recorded as finished."""
        self._stopping = True
        await asyncio.to_thread(self.executor.shutdown)

    def resume(self) -> None:
        """After a restart: continue every transfer that was under way (as new attempts; the
        attempts recorded running are marked lost)."""
        lost = self.store.lose_attempts()
        if lost:
            log.info("attempts lost with the daemon's stop", attempts=len(lost))
            self.executor.abandon(lost)
        for job in self.store.jobs((JobState.STAGING_IN, JobState.STAGING_OUT)):
            verb = "stage_in" if job.state == JobState.STAGING_IN else "stage_out"
            log.info("resuming", job_id=job.job_id, phase=verb)
            self._start_phase(job, verb)
        for job in self.store.jobs((JobState.RUNNING,)):  # its in-job copies under way
            for d in job.directives:
                if d.verb == COPY and d.state in UNFINISHED:
                    log.info("resuming", job_id=job.job_id, copy=d.idx)
                    self._start(job, d)

    # -- reads, for the servers and the reconciler: no module outside the engine holds its
    # store (tests/unit/test_layout.py), so every change of a record is the engine's --------

    def job(self, job_id: str) -> JobRow | None:
        """The job and its directives (a row shared with other readers: read only)."""
        return self.store.job(job_id)

    def jobs(
        self, states: tuple[str, ...] | None = None, updated_since: float | None = None
    ) -> list[JobRow]:
        """Jobs in ``states`` (all if None), last updated at or after ``updated_since`` if
        given, oldest first (read only)."""
        return self.store.jobs(states, updated_since)

    def jobs_of(self, uid: int | None) -> list[JobRow]:
        """``uid``'s jobs (every job for None), oldest first, in one read transaction of
        their own (``bbstage jobs``: call it in a thread)."""
        return self.store.jobs_of(uid)

    def attempts(self, job_id: str) -> list[AttemptRow]:
        """The job's transfer attempts, by directive, oldest first."""
        return self.store.attempts(job_id)

    def nodes(self) -> dict[str, list[str]]:
        """Job id → the transfer nodes its attempts ran on."""
        return self.store.nodes()

    def pools(self) -> dict[str, dict[str, int]]:
        """Each pool's capacity and what the jobs not yet finished hold of it."""
        return report.pools(self.config, self.store)

    # -- in-job copies (bbstage copy) -----------------------------------------------------------

    def add_copy(
        self, job: JobRow, source: str, destination: str, options: dict[str, str], at_end: bool
    ) -> DirectiveRow:
        """Add a copy to a running job, checked by a directive's rules (``Refused`` with the
        directive's message): started now, or (``at_end``) a stage-out like the script's.
        The caller has checked that the job runs and is the caller's."""
        if job.state != JobState.RUNNING:
            raise Refused(f"job {job.job_id} is not running ({job.state}): copies are"
                          " added from inside the running job")  # fmt: skip
        try:
            spec = directives.copy(source, destination, options)
            spec |= {"verb": "stage_out" if at_end else COPY,
                     "origin": "at_end" if at_end else COPY}  # fmt: skip
            d = self.store.add_directive(job.job_id, spec, MAX_JOB_DIRECTIVES)
        except ValueError as exc:  # the directive's rules, the most a job may have
            raise Refused(str(exc)) from None
        log.info("copy added", job_id=job.job_id, index=d.idx, at_end=at_end)
        if not at_end:
            self._start(self.store.job(job.job_id) or job, d)
        return d

    async def cancel_copy(self, job: JobRow, idx: int) -> DirectiveRow:
        """Stop an in-job copy (recorded cancelled: it then fails nothing), or drop a copy
        --at-end that has not started."""
        d = next((d for d in job.directives if d.idx == idx and d.spec.get("origin")), None)
        if d is None:
            raise Refused(f"job {job.job_id} has no copy {idx}")
        if d.state in UNFINISHED:
            if (job.job_id, idx) in self._running:
                await self._cancel(job.job_id, idx)
            current = self.store.job(job.job_id)
            row = next(r for r in current.directives if r.idx == idx) if current else d
            if row.state in UNFINISHED:
                self.store.set_directive(
                    job.job_id, idx, state=DirectiveState.CANCELLED, finished=time.time()
                )
        current = self.store.job(job.job_id)
        return next((r for r in current.directives if r.idx == idx), d) if current else d

    # -- hooks --------------------------------------------------------------------------------

    async def setup(self, req: Request) -> Reply:
        """Record the job and create its scratch space; with ``stage_in`` (the hooks send it
        where data_in blocks, before 24.05) start staging in at once: Slurm calls data_in
        right after setup, and finds the copy under way (or done)."""
        job_id = req.job_id
        array = req.get("array_job_id")
        if isinstance(array, str):
            conf = str(self.config.slurm_conf) if self.config.slurm_conf else None
            script = req.get("script_path")
            await asyncio.to_thread(slurmdirs.mend_task, job_id, array, script, conf)
        job = self.store.job(job_id)
        if job is not None and job.state not in FINISHED:
            if _same_job(job, req):
                return Reply.ok()  # a re-run of setup: already done
            await self._forget_stale(job)
        if req.get("stage_in") is True:
            job = self._create(req, job_id, state=JobState.STAGING_IN)
            # Right after this reply goes out: Slurm sets up a job array's tasks in bursts,
            # and the next setup is waiting. (A restart resumes jobs in staging_in.)
            asyncio.get_running_loop().call_soon(self._start_phase, job, "stage_in")
        else:
            self._create(req, job_id)
        return Reply.ok()

    async def _forget_stale(self, job: JobRow) -> None:
        """A new job reuses the id of an unfinished record (Slurm's job ids started again, or
        a teardown was lost): stop the old transfers, set aside a scratch that still holds
        results (``<pool>/<id>.kept-<time>``), and let the new job have the id."""
        log.warning("job id reused: the unfinished earlier record is replaced", job_id=job.job_id,
                    old_uid=job.uid, old_state=job.state)  # fmt: skip
        running = [d for d in job.directives if (job.job_id, d.idx) in self._running]
        await asyncio.gather(*(self._cancel(job.job_id, d.idx) for d in running))
        pool = self.config.pool(job.pool)
        if pool is not None and job.scratch:
            if _outputs_at_risk(job):
                kept = await asyncio.to_thread(scratch.set_aside, pool, job.job_id)
                log.warning("scratch kept", job_id=job.job_id, scratch=str(kept))
            else:
                await asyncio.to_thread(scratch.remove, pool, job.job_id)

    def _create(
        self,
        req: Request,
        job_id: str,
        state: JobState = JobState.SETUP,
        origin: str = "setup",
    ) -> JobRow:
        """Record a new job (in ``state``) and create its scratch space; ``Refused`` (or
        ``IdentityError``) if the script, the owner or the pool request is not acceptable."""
        parsed = directives.parse(req.get("script", ""))
        if parsed["errors"]:
            raise Refused("; ".join(e["message"] for e in parsed["errors"][:3]))
        uid, gid = int(req.get("uid", -1)), int(req.get("gid", -1))
        Identity.of(uid, gid)  # refuse unknown users and root before creating anything
        wanted = _slurm_value(req.get("pool")) or parsed.get("pool")
        pool = self.config.pool(wanted)
        if wanted and pool is None:
            raise Refused(f"unknown pool {wanted!r}: see `bbstage pools`")
        size = int(req.get("size") or parsed.get("capacity") or 0)
        path = None
        if pool is not None:
            free = max(0, pool.capacity - self.store.reserved().get(pool.name, 0))
            if size and size > free:
                raise Refused(
                    f"pool {pool.name} has {free} bytes free, the job asks for capacity={size}"
                )
            recovered = origin == "recovered"
            path = str(scratch.create(pool, job_id, uid, gid, recovered=recovered))
        staged.unmark(self._staged, job_id)  # a verdict about an earlier run of this job id
        job = self.store.create_job(
            job_id,
            uid=uid,
            gid=gid,
            pool=pool.name if pool else None,
            size=size,
            scratch=path,
            directives=parsed["directives"],
            state=state,
            origin=origin,
        )
        log.info("job created", job_id=job_id, directives=len(job.directives))
        return job

    async def data_in(self, req: Request) -> Reply:
        return await self._stage(req, "stage_in")

    async def data_out(self, req: Request) -> Reply:
        return await self._stage(req, "stage_out")

    async def test_data_in(self, req: Request) -> Reply:
        return await self._polled(req, "stage_in")

    async def test_data_out(self, req: Request) -> Reply:
        return await self._polled(req, "stage_out")

    async def real_size(self, req: Request) -> Reply:
        job = self.store.job(req.job_id)
        return Reply.ok(str(job.size) if job and job.size else "")

    async def pre_run(self, req: Request) -> Reply:
        job = self._known(req)  # never start a job whose inputs nobody vouches for
        if job.state in FINISHED:
            # Torn down before it ran (its scratch is gone): Slurm lost track of it, e.g. a
            # slurmctld restart while its stage-in hook ran. A new setup makes a new record.
            raise Refused(
                f"job {job.job_id} was torn down before it started ({job.state}):"
                " its staged inputs are gone; requeue or resubmit it"
            )
        waiting = job.state in (JobState.SETUP, JobState.STAGING_IN)
        if waiting or self._test(job.job_id, "stage_in").status != OK:
            raise Refused(f"job {job.job_id}: its stage-in has not finished ({job.state})")
        if req.get("nodes"):  # 24.05+: job_info.nodes, known from pre_run on
            log.info("job starts", job_id=job.job_id, nodes=req.get("nodes"))
        if job.state == JobState.STAGED_IN:  # not a re-run of pre_run (running or later)
            self.store.set_job(job.job_id, state=JobState.RUNNING)
        return Reply.ok()

    async def post_run(self, req: Request) -> Reply:
        self._known(req)
        return Reply.ok()

    async def teardown(self, req: Request) -> Reply:
        if self.store.job(req.job_id) is None:
            staged.unmark(self._staged, req.job_id)
            self._order.pop(req.job_id, None)
            await self._sweep_lost(req)
        else:
            await self.end_job(req.job_id, hurry=req.get("hurry") in (True, "true"))
        return Reply.ok()

    async def end_job(self, job_id: str, hurry: bool) -> None:
        """Tear a job down: Slurm's teardown hook, or (``bbstage.daemon.reconcile``, in a ``hurry``)
        for a job Slurm no longer runs. In-job copies finish first unless ``hurry``, which
        cancels every transfer; the scratch goes unless it holds results."""
        staged.unmark(self._staged, job_id)
        self._order.pop(job_id, None)
        job = self.store.job(job_id)
        if job is None:
            return
        copies = [r.future for d in job.directives if d.verb == COPY
                  and (r := self._running.get((job.job_id, d.idx))) is not None]  # fmt: skip
        if copies and not hurry:  # outputs: they finish before the scratch goes
            log.info("teardown waits for in-job copies", job_id=job.job_id, copies=len(copies))
            await asyncio.wait(copies)
            job = self.store.job(job_id) or job
        # From here the teardown decides the job's end: the transfers it cancels do not
        # settle their phase (``_settle``).
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
            await asyncio.gather(*(self._cancel(job.job_id, d.idx) for d in cancelled))
            log.info(
                "transfers cancelled", job_id=job.job_id, directives=[d.idx for d in cancelled]
            )
        pool = self.config.pool(job.pool)
        if job.origin != "setup":
            # Recreated after the daemon lost its state: whatever scratch holds is not ours
            # to judge, so it stays (an admin removes it; `bbstage jobs` lists it).
            self._fail(job, f"state was lost: scratch {job.scratch} kept")
            log.warning("scratch kept", job_id=job.job_id, scratch=job.scratch, reason="recovered")
        elif _outputs_at_risk(job):
            # Never delete results that did not reach their destination.
            days = self.config.retention_days
            self._fail(
                job, f"stage-out incomplete: outputs kept in {job.scratch} for {days:g} days"
            )
            log.warning("scratch kept", job_id=job.job_id, scratch=job.scratch)
        else:
            if pool is not None:
                await asyncio.to_thread(scratch.remove, pool, job.job_id)
            # The job as it is now: while this teardown awaited, another (Slurm's teardown
            # hook beside the reconciler's) may have ended it.
            now = self.store.job(job.job_id) or job
            if now.state not in FINISHED:
                hurried = hurry and now.state != JobState.STAGED_OUT
                self.store.set_job(
                    job.job_id, state=JobState.CANCELLED if hurried else JobState.DONE
                )

    def _fail(self, job: JobRow, error: str) -> None:
        """Fail ``job`` with ``error`` added to its own (a failed job just gets the error)."""
        job = self.store.job(job.job_id) or job  # as it is now, not as a caller last read it
        if job.state == JobState.FAILED:
            self.store.set_job(job.job_id, error=_join(job.error, error))
        else:
            self.store.set_job(job.job_id, state=JobState.FAILED, error=_join(job.error, error))

    def fail_job(self, job_id: str, error: str) -> None:
        """Fail a job for ``error``, a reason found outside its hooks (``bbstage.daemon.reconcile``:
        Slurm stranded it); ``IllegalTransition`` if it has ended other than cancelled."""
        self.store.set_job(job_id, state=JobState.FAILED, error=error)

    async def record_progress(self) -> None:
        """Every ``PROGRESS_EVERY`` seconds, save the running transfers' counts, and their
        attempts' on transfer nodes (the worker reports them several times a second; the
        last ones are saved as a transfer or attempt ends)."""
        written: dict[tuple[str, int], dict[str, int]] = {}
        saved: dict[str, AttemptUpdate] = {}
        while True:
            await asyncio.sleep(PROGRESS_EVERY)
            for (job_id, idx), run in list(self._running.items()):
                counts = run.counts
                if counts and written.get((job_id, idx)) is not counts:
                    written[(job_id, idx)] = counts  # tried once: a bad one is not retried
                    try:
                        self.store.set_directive(job_id, idx, **counts)
                    except Exception:  # one bad record must not stop everyone's progress
                        log.exception("progress not saved", job_id=job_id, directive=idx)
            written = {k: v for k, v in written.items() if k in self._running}
            try:
                saved = self._save_attempts(saved)
            except Exception:
                saved = self._moving()  # not tried again until they change
                log.exception("attempts' progress not saved")

    def _moving(self) -> dict[str, AttemptUpdate]:
        """The running attempts on transfer nodes (Dask): their latest update, by id."""
        return {i: u for run in list(self._running.values()) for i, u in dict(run.attempts).items()}

    def _save_attempts(self, saved: dict[str, AttemptUpdate]) -> dict[str, AttemptUpdate]:
        """Save the running attempts' updates not ``saved`` yet (one transaction); the
        updates saved now."""
        moving = self._moving()
        changed = [u for u in moving.values() if saved.get(u.id) is not u]
        if changed:
            self.store.attempt_progress([(u.id, u.node, u.bytes, u.files) for u in changed])
        return moving

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

    async def get_status(self, req: Request) -> Reply:
        return Reply.ok(report.bbstat(self.store, req.get("args") or [], req.get("uid")))

    # -- staging ------------------------------------------------------------------------------

    def _known(self, req: Request) -> JobRow:
        job = self.store.job(req.job_id)
        if job is None:
            raise Refused(
                f"job {req.job_id} is unknown to the staging daemon (its state was lost):"
                " requeue the job"
            )
        return job

    async def _job(self, req: Request, verb: str) -> JobRow:
        """The job, or (24.05+ hooks carry uid and gid) a record made again from the request
        after the daemon lost its state: marked ``recovered``, so teardown deletes nothing."""
        job = self.store.job(req.job_id)
        if job is None and req.get("uid") is not None and req.get("script"):
            state = JobState.SETUP if verb == "stage_in" else JobState.RUNNING
            job = self._create(req, req.job_id, state=state, origin="recovered")
            log.warning("job recreated after a lost state", job_id=job.job_id, phase=verb)
        if job is None:
            await self._sweep_lost(req)
        return job or self._known(req)

    async def _polled(self, req: Request, verb: str) -> Reply:
        reply = self._test(req.job_id, verb)  # every PollInterval: one lookup when known
        if reply.status == ERROR and self.store.job(req.job_id) is None:
            await self._sweep_lost(req)
        return reply

    async def _sweep_lost(self, req: Request) -> None:
        """A job the daemon has no record of (its state was lost, or setup refused it): no
        record of what its workers wrote either, so the script (``script``, or Slurm's copy
        at ``script_path``) says where their temporary files may be
        (bbstage/daemon/leftovers.py)."""
        script = req.get("script")
        if not script and not req.get("script_path"):
            return
        if not self._sweeps.due(req.job_id):  # a poll of test_data_in: swept lately
            return
        if not script:
            script = await asyncio.to_thread(leftovers.read, req.get("script_path"), req.job_id)
        if script:
            uid = str(req.get("uid", ""))  # 24.05+: the job's owner; only their files go
            owner = int(uid) if uid.isascii() and uid.isdigit() else None
            await asyncio.to_thread(leftovers.sweep, script, req.job_id, owner)

    async def _stage(self, req: Request, verb: str) -> Reply:
        job = await self._job(req, verb)
        if job.state in FINISHED:
            if any(
                d.verb == verb and d.state in (DirectiveState.FAILED, DirectiveState.CANCELLED)
                for d in job.directives
            ):
                return self._test(job.job_id, verb)  # e.g. the stage-in setup started failed
            return Reply.error(f"job {job.job_id} was already torn down ({job.state})")
        futures = self._begin(job, verb)
        if not req.get("wait", True):
            return Reply.ok()
        # Before 24.05 an answer is final: Slurm runs the job on any success. So wait until
        # no transfer of this direction runs (a transient failure starts a new attempt).
        # asyncio.wait, not gather: a hook that goes away must not cancel the transfers.
        keys = [(job.job_id, d.idx) for d in job.directives if _of_phase(d, verb)]
        while futures:
            await asyncio.wait(futures)
            futures = [self._running[k].future for k in keys if k in self._running]
        reply = self._test(job.job_id, verb)
        if reply.status == BUSY:  # e.g. stopped by a shutdown: never "done" by default
            return Reply.error(f"job {job.job_id}: {verb} interrupted, try again")
        return reply

    def _begin(self, job: JobRow, verb: str) -> list[asyncio.Future[Done]]:
        """Enter the phase if the job is before it, and start or join its transfers; a job
        past it (a hook sent again late) is answered from the record."""
        staging, staged = _PHASE[verb]
        if _LIFECYCLE.index(job.state) > _LIFECYCLE.index(staged):
            return []
        if job.state not in (staging, staged):
            self.store.set_job(job.job_id, state=staging, error="")
            job = self.store.job(job.job_id) or job
        return self._start_phase(job, verb)

    def _start_phase(self, job: JobRow, verb: str) -> list[asyncio.Future[Done]]:
        """Start (or join) every unfinished directive of one direction."""
        futures = []
        for d in job.directives:
            if not _of_phase(d, verb) or d.state == DirectiveState.DONE:
                continue
            ended = d.state in (DirectiveState.FAILED, DirectiveState.CANCELLED)
            if ended and (job.job_id, d.idx) not in self._running:
                continue  # a recorded failure (or a cancelled copy) stands until teardown
            futures.append(self._start(job, d))
        if not futures:
            self._settle(self.store.job(job.job_id), verb)  # nothing (left) to move
        return futures

    def _start(self, job: JobRow, d: DirectiveRow, tries: int = 1) -> asyncio.Future[Done]:
        """Start a directive's transfer (its ``tries``-th try), or join the one running."""
        key = (job.job_id, d.idx)
        if key in self._running:
            return self._running[key].future
        assert job.uid is not None and job.gid is not None
        identity = Identity.of(job.uid, job.gid)
        # An earlier attempt (before a restart, or killed) may have left temporary files.
        try:
            spec = self._spec(job, d).but(resumed=d.started is not None)
        except (ValueError, TransferError) as exc:  # no scratch for $BB_SCRATCH, no backend
            raise Refused(str(exc)) from None
        self.store.set_directive(
            job.job_id, d.idx, state=DirectiveState.RUNNING, error="", started=time.time()
        )
        order = self._order.get(job.job_id, (math.inf, 0.0))
        run = _Running(tries)

        def on_event(event: Event | AttemptUpdate) -> None:  # in the executor's thread
            self._on_event(job.job_id, d.idx, run, event)

        cf = self.executor.submit(f"{job.job_id}:{d.idx}", spec, identity, on_event, order=order)
        run.future = asyncio.wrap_future(cf)
        self._running[key] = run
        run.future.add_done_callback(lambda f: self._finished(job.job_id, d, run))
        log.debug("transfer started", job_id=job.job_id, directive=d.idx, verb=d.verb)
        return run.future

    def _on_event(self, job_id: str, idx: int, run: _Running, event: Event | AttemptUpdate) -> None:
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

    def _attempt(self, job_id: str, idx: int, run: _Running, update: AttemptUpdate) -> None:
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

    def _finished(self, job_id: str, d: DirectiveRow, run: _Running) -> None:
        """Record a transfer's outcome (``_record_end``). Should that fail (a count the state
        cannot hold, a database error), the directive is failed with the reason instead of
        staying ``running`` for ever, and the job settled."""
        try:
            self._record_end(job_id, d, run)
        except Exception as exc:
            log.exception("transfer outcome not recorded", job_id=job_id, directive=d.idx)
            if (job_id, d.idx) in self._running:  # a new attempt started: it will record
                return
            error = f"internal error while recording the transfer's end: {exc!r}"
            try:
                self.store.set_directive(job_id, d.idx, state=DirectiveState.FAILED, error=error,
                                         finished=time.time())  # fmt: skip
                self._settle(self.store.job(job_id), d.verb)
            except Exception:
                log.exception("transfer failure not recorded", job_id=job_id, directive=d.idx)

    def _record_end(self, job_id: str, d: DirectiveRow, run: _Running) -> None:
        """Record a transfer's outcome: done only from the worker's manifest, and only if it
        covers everything the worker planned; a shutdown records nothing (resumed later)."""
        key, future, counts = (job_id, d.idx), run.future, run.counts
        if self._running.get(key) is run:
            del self._running[key]
        # What the worker promised (its final Planned event: its walk ended), if it got
        # that far; the counts of a walk still under way are no plan.
        plan = Planned(counts["bytes_total"], counts["files_total"]) if run.final else None
        if future.cancelled() or (self._stopping and future.exception() is not None):
            log.info("transfer interrupted, resumes on start", job_id=job_id, directive=d.idx)
            return
        exc = future.exception()
        now = time.time()
        if exc is None:
            done = future.result()
            if plan is None or not done.covers(plan):
                exc = TransferError(
                    f"incomplete: the worker committed {done.files} files ({done.bytes} bytes)"
                    f" of the {plan.files if plan else '?'} files"
                    f" ({plan.bytes if plan else '?'} bytes) it planned"
                )
        error = bounded(str(exc)) if exc is not None else ""  # for the log (the store bounds)
        if exc is None:
            state = DirectiveState.DONE
            counts |= {"bytes_done": done.bytes, "files_done": done.files}  # the manifest's
            self.store.set_directive(job_id, d.idx, state=state, finished=now, **counts)
            log.info("transfer done", job_id=job_id, directive=d.idx)
        else:
            transient = isinstance(exc, TransferError) and not exc.permanent
            job = self.store.job(job_id)
            if transient and run.tries < ATTEMPTS and job is not None:
                log.warning("transfer failed, trying again", job_id=job_id, directive=d.idx,
                            attempt=run.tries, error=error)  # fmt: skip
                again = next(r for r in job.directives if r.idx == d.idx)
                self._start(job, again, run.tries + 1)
                return
            state = (
                DirectiveState.CANCELLED if isinstance(exc, Cancelled) else DirectiveState.FAILED
            )
            self.store.set_directive(
                job_id, d.idx, state=state, error=str(exc), finished=now, **counts
            )
            log.warning("transfer failed", job_id=job_id, directive=d.idx, error=error)
        job = self.store.job(job_id)
        row = next((r for r in job.directives if r.idx == d.idx), None) if job else None
        if row is not None:
            direction = "in" if d.verb == "stage_in" else "out"
            elapsed = now - (row.started or now)
            self._emit(
                TransferEnded(
                    direction,
                    state,
                    elapsed,
                    row.bytes_done,
                    row.files_done,
                    job.uid if job else None,
                )
            )
        self._settle(job, d.verb)

    def _settle(self, job: JobRow | None, verb: str) -> None:
        """Move the job to ``staged_*`` or ``failed`` once a direction has finished (not while
        its teardown decides its end)."""
        verb = "stage_out" if verb == COPY else verb
        if job is None or job.state != _PHASE[verb][0] or job.job_id in self._tearing:
            return
        mine = [d for d in job.directives if _of_phase(d, verb)]
        if any(d.state in UNFINISHED for d in mine):
            return
        failed = [d for d in mine if _failed(d)]
        if failed:
            self.store.set_job(job.job_id, state=JobState.FAILED, error=_describe(failed[0]))
        else:
            self.store.set_job(job.job_id, state=_PHASE[verb][1])
            if verb == "stage_in":
                staged.mark(self._staged, job.job_id)

    def _test(self, job_id: str, verb: str) -> Reply:
        job = self.store.job(job_id)
        if job is None:
            return Reply.error(f"job {job_id} is unknown to the staging daemon")
        mine = [d for d in job.directives if _of_phase(d, verb)]
        failed = [d for d in mine if _failed(d)]
        if failed:
            # The first failing line of the script, not whichever failed first: a line above
            # it still running may fail too (the hold's reason is given once).
            if any(d.state in UNFINISHED for d in mine if d.idx < failed[0].idx):
                return Reply.busy()
            return Reply.error(_describe(failed[0]))
        if all(d.state in (DirectiveState.DONE, DirectiveState.CANCELLED) for d in mine):
            return Reply.ok()
        return Reply.busy()

    async def _cancel(self, job_id: str, idx: int) -> None:
        run = self._running.get((job_id, idx))
        if run is not None:
            run.tries = ATTEMPTS  # a cancelled transfer is not tried again
        await asyncio.to_thread(self.executor.cancel, f"{job_id}:{idx}")
        if run is not None:
            await asyncio.wait([run.future])

    def _spec(self, job: JobRow, d: DirectiveRow) -> TransferSpec:
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


def _order_of(req: Request) -> tuple[float, float]:
    """A job's place among its user's transfers: the start Slurm expects (``start_time``,
    0 when it has none), then the higher ``priority``; a hook that does not send them
    (22.05 has no job_info) leaves arrival order."""

    def number(name: str) -> float:
        try:
            value = float(req.get(name) or 0)
        except (TypeError, ValueError):
            return 0.0
        return value if math.isfinite(value) else 0.0

    start = number("start_time")
    return (start if start > 0 else math.inf, -number("priority"))


def _outputs_at_risk(job: JobRow) -> bool:
    """Does scratch hold results not yet staged out? A stage-out from it started and did
    not finish, or the job ran (or was running when torn down) and one never started."""
    ran = job.state in (JobState.RUNNING, JobState.STAGING_OUT)
    return any(
        _of_phase(d, "stage_out")
        and d.spec.get("source_kind") == "scratch"
        and (
            d.state in (DirectiveState.RUNNING, DirectiveState.FAILED)
            or (ran and d.state == DirectiveState.PENDING)
            or _failed(d)
        )
        for d in job.directives
    )


def _of_phase(d: DirectiveRow, verb: str) -> bool:
    """Does ``d`` belong to ``verb``'s phase? An in-job copy is one of the job's outputs."""
    return d.verb == verb or (verb == "stage_out" and d.verb == COPY)


def _failed(d: DirectiveRow) -> bool:
    """Does ``d`` fail its phase? A copy the user cancelled (``bbstage cancel``) does not."""
    return d.state == DirectiveState.FAILED or (
        d.state == DirectiveState.CANCELLED and not _added(d)
    )


def _added(d: DirectiveRow) -> bool:
    """Was ``d`` added at run time (``bbstage copy``, with or without --at-end)?"""
    return bool(d.spec.get("origin"))


def _same_job(job: JobRow, req: Request) -> bool:
    """Is a setup request for ``job`` a re-run (same owner and directives), not a new job
    that reuses the id?"""
    if (job.uid, job.gid) != (int(req.get("uid", -1)), int(req.get("gid", -1))):
        return False
    parsed = directives.parse(req.get("script", ""))
    mine = [d.spec for d in job.directives]
    return json.dumps(mine, sort_keys=True) == json.dumps(parsed["directives"], sort_keys=True)


def _scratch_limit(job: JobRow, spec: dict[str, Any]) -> ScratchLimit | None:
    """Staging into scratch may use at most the job's ``capacity=`` (when it asked for one)."""
    if spec.get("destination_kind") != "scratch" or not job.size or not job.scratch:
        return None
    return ScratchLimit(job.scratch, job.size)


def _join(*errors: str) -> str:
    return "; ".join(e for e in errors if e)


def _slurm_value(value: Any) -> str | None:
    """Slurm passes a missing string argument as "(null)"."""
    return None if value in (None, "", "(null)") else str(value)


def _describe(d: DirectiveRow) -> str:
    if d.spec.get("origin"):  # bbstage copy: no line of the script
        what = "copy --at-end" if d.verb == "stage_out" else "in-job copy"
        return f"{what} {d.idx} ({d.source} -> {d.destination}): {d.error or d.state}"
    return f"{d.verb} line {d.line}: {d.error or d.state}"
