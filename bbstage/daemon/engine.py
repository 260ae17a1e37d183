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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog

from bbstage import directives
from bbstage.config import Config
from bbstage.daemon import lifecycle, report, scratch, slurmdirs, staged
from bbstage.daemon.cleanup import Cleanup
from bbstage.daemon.contracts import Executor
from bbstage.daemon.events import EngineEvent, HookAnswered
from bbstage.daemon.lifecycle import (
    COPY,
    Action,
    Emit,
    MarkStaged,
    Note,
    Refused,
    SetDirective,
    SetJob,
    Start,
    of_phase,
)
from bbstage.daemon.state import (
    ACTIVE,
    FINISHED,
    UNFINISHED,
    AttemptRow,
    DirectiveRow,
    DirectiveState,
    JobRow,
    JobState,
    Store,
)
from bbstage.daemon.transfers import Transfers
from bbstage.daemon.usage import Usage
from bbstage.identity import Identity, IdentityError
from bbstage.movers import Registry
from bbstage.protocol import BUSY, ERROR, ProtocolError, Reply, Request
from bbstage.transfer import Done

log = structlog.get_logger("bbstage.daemon.engine")

MAX_JOB_DIRECTIVES = 1024  # a script's directives and its in-job copies together
__all__ = ["Engine", "Refused", "internal_error"]


def internal_error(exc: BaseException, op: str, job_id: object) -> str:
    """The answer to a request that met a bug in the daemon (an unexpected exception): not
    the job's fault, and where its traceback is (logged by the caller, with ``op``)."""
    return (
        f"staging daemon internal error ({type(exc).__name__}): a bug in bbstage, not a problem"
        f" with the job; the traceback is in the daemon's log (journalctl -u bbstage:"
        f" {op}, job {job_id})"
    )


class Engine:
    def __init__(self, config: Config, store: Store, executor: Executor) -> None:
        self._config, self.store, self._executor = config, store, executor
        self._staged = staged.directory(config)
        staged.prepare(self._staged)
        self._tearing: set[str] = set()  # jobs whose teardown is deciding their end
        self.transfers = Transfers(config, store, executor, self._do, self._tearing)
        self.usage = Usage()  # what the jobs' scratch holds, measured by usage.forever
        self._running = self.transfers.running  # by (job id, directive index)
        self.cleanup = Cleanup(config, store, self.transfers, self._do, self._staged, self._tearing)
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

    @property
    def config(self) -> Config:
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        """A new configuration, for the parts the engine holds too."""
        self._config = self.transfers.config = self.cleanup.config = config

    @property
    def executor(self) -> Executor:
        return self._executor

    @executor.setter
    def executor(self, executor: Executor) -> None:
        """Another executor, for the transfers started from now on."""
        self._executor = self.transfers.executor = executor

    async def handle(self, request: Request) -> Reply:
        """Answer one hook; log one line for it: who asked (which hooks carry the owner:
        all on 24.05+, setup only on 22.05), the verdict, and how long it took."""
        started = time.perf_counter()
        try:
            if request.op in ("setup", "data_in", "data_out"):
                self.transfers.order[request.job_id] = order_of(request)
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
        await self.transfers.stop()

    def resume(self) -> None:
        """After a restart: continue every transfer that was under way (as new attempts; the
        attempts recorded running are marked lost)."""
        lost = self.store.lose_attempts()
        if lost:
            log.info("attempts lost with the daemon's stop", attempts=len(lost))
            self.executor.abandon(lost)
        staging = self.store.jobs((JobState.STAGING_IN, JobState.STAGING_OUT))
        for job in staging + self.store.jobs((JobState.RUNNING,)):  # then in-job copies
            self._do(lifecycle.resume(job, self.transfers.of(job), self._tearing_of(job)).actions)

    # -- decisions carried out ----------------------------------------------------------------

    def _do(self, actions: Sequence[Action]) -> list[asyncio.Future[Done]]:
        """Carry out a decision's actions (``lifecycle.py``), in order: every job and
        directive state it changes is written here, through the store; the futures of the
        transfers it starts or joins."""
        futures = []
        for action in actions:
            if isinstance(action, SetJob):
                self.store.set_job(action.job_id, **action.values)
            elif isinstance(action, SetDirective):
                self.store.set_directive(action.job_id, action.idx, **action.values)
            elif isinstance(action, Start):
                job = self.store.job(action.job_id)
                assert job is not None, f"job {action.job_id} to start a transfer of is gone"
                d = next(r for r in job.directives if r.idx == action.idx)
                futures.append(self.transfers.start(job, d, action.tries))
            elif isinstance(action, MarkStaged):
                staged.mark(self._staged, action.job_id)
            elif isinstance(action, Emit):
                self._emit(action.event)
            elif isinstance(action, Note):
                getattr(log, action.level)(action.event, **action.fields)
        return futures

    def _tearing_of(self, job: JobRow | None) -> bool:
        return job is not None and job.job_id in self._tearing

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

    def active(self) -> list[JobRow]:
        """The jobs not yet finished (read from the database: call it in a thread)."""
        return self.store.jobs(ACTIVE)

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
        return report.pools(self.config, self.store, self.usage)

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
            spec = directives.copy(source, destination, options, self.config.registry)
            spec |= {"verb": "stage_out" if at_end else COPY,
                     "origin": "at_end" if at_end else COPY}  # fmt: skip
            d = self.store.add_directive(job.job_id, spec, MAX_JOB_DIRECTIVES)
        except ValueError as exc:  # the directive's rules, the most a job may have
            raise Refused(str(exc)) from None
        log.info("copy added", job_id=job.job_id, index=d.idx, at_end=at_end)
        if not at_end:
            self.transfers.start(self.store.job(job.job_id) or job, d)
        return d

    async def cancel_copy(self, job: JobRow, idx: int) -> DirectiveRow:
        """Stop an in-job copy (recorded cancelled: it then fails nothing), or drop a copy
        --at-end that has not started."""
        d = next((d for d in job.directives if d.idx == idx and d.spec.get("origin")), None)
        if d is None:
            raise Refused(f"job {job.job_id} has no copy {idx}")
        if d.state in UNFINISHED:
            if (job.job_id, idx) in self._running:
                await self.transfers.cancel(job.job_id, idx)
            current = self.store.job(job.job_id)
            row = next(r for r in current.directives if r.idx == idx) if current else d
            if row.state in UNFINISHED:
                values = {"state": DirectiveState.CANCELLED, "finished": time.time()}
                self._do((SetDirective(job.job_id, idx, values),))
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
            if _same_job(job, req, self.config.registry):
                return Reply.ok()  # a re-run of setup: already done
            await self.cleanup.forget_stale(job)
        if req.get("stage_in") is True:
            job = self._create(req, job_id, state=JobState.STAGING_IN)
            # Right after this reply goes out: Slurm sets up a job array's tasks in bursts,
            # and the next setup is waiting. (A restart resumes jobs in staging_in.)
            asyncio.get_running_loop().call_soon(self._start_phase, job, "stage_in")
        else:
            self._create(req, job_id)
        return Reply.ok()

    def _create(
        self,
        req: Request,
        job_id: str,
        state: JobState = JobState.SETUP,
        origin: str = "setup",
    ) -> JobRow:
        """Record a new job (in ``state``) and create its scratch space; ``Refused`` (or
        ``IdentityError``) if the script, the owner or the pool request is not acceptable."""
        parsed = directives.parse(req.get("script", ""), self.config.registry)
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
        decision = lifecycle.start_run(job)
        if req.get("nodes"):  # 24.05+: job_info.nodes, known from pre_run on
            log.info("job starts", job_id=job.job_id, nodes=req.get("nodes"))
        self._do(decision.actions)
        return Reply.ok()

    async def post_run(self, req: Request) -> Reply:
        self._known(req)
        return Reply.ok()

    async def teardown(self, req: Request) -> Reply:
        if self.store.job(req.job_id) is None:
            staged.unmark(self._staged, req.job_id)
            self.transfers.order.pop(req.job_id, None)
            await self.cleanup.sweep_lost(req)
        else:
            await self.end_job(req.job_id, hurry=req.get("hurry") in (True, "true"))
        return Reply.ok()

    async def end_job(self, job_id: str, hurry: bool) -> None:
        """Tear a job down: Slurm's teardown hook, or (``bbstage.daemon.reconcile``, in a ``hurry``)
        for a job Slurm no longer runs (``Cleanup.end_job``)."""
        await self.cleanup.end_job(job_id, hurry)

    def fail_job(self, job_id: str, error: str) -> None:
        """Fail a job for ``error``, a reason found outside its hooks (``bbstage.daemon.reconcile``:
        Slurm stranded it); ``IllegalTransition`` if it has ended other than cancelled."""
        self._do((SetJob(job_id, {"state": JobState.FAILED, "error": error}),))

    async def record_progress(self) -> None:
        """Save the running transfers' progress, for ever (``Transfers.record_progress``)."""
        await self.transfers.record_progress()

    async def purge_expired(self) -> None:
        """Forget jobs finished longer than ``retention_days`` ago, and any scratch they kept."""
        await self.cleanup.purge_expired()

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
            await self.cleanup.sweep_lost(req)
        return job or self._known(req)

    async def _polled(self, req: Request, verb: str) -> Reply:
        reply = self._test(req.job_id, verb)  # every PollInterval: one lookup when known
        if reply.status == ERROR and self.store.job(req.job_id) is None:
            await self.cleanup.sweep_lost(req)
        return reply

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
        keys = [(job.job_id, d.idx) for d in job.directives if of_phase(d, verb)]
        while futures:
            await asyncio.wait(futures)
            futures = [self._running[k].future for k in keys if k in self._running]
        reply = self._test(job.job_id, verb)
        if reply.status == BUSY:  # e.g. stopped by a shutdown: never "done" by default
            return Reply.error(f"job {job.job_id}: {verb} interrupted, try again")
        return reply

    def _begin(self, job: JobRow, verb: str) -> list[asyncio.Future[Done]]:
        """Enter the phase if the job is before it, and start or join its transfers
        (``lifecycle.begin``): their futures."""
        tearing = self._tearing_of(job)
        return self._do(lifecycle.begin(job, verb, self.transfers.of(job), tearing).actions)

    def _start_phase(self, job: JobRow, verb: str) -> list[asyncio.Future[Done]]:
        """Start (or join) every unfinished directive of one direction."""
        tearing = self._tearing_of(job)
        return self._do(lifecycle.start_phase(job, verb, self.transfers.of(job), tearing).actions)

    def _test(self, job_id: str, verb: str) -> Reply:
        job = self.store.job(job_id)
        if job is None:
            return Reply.error(f"job {job_id} is unknown to the staging daemon")
        return lifecycle.verdict(job, verb)


def order_of(req: Request) -> tuple[float, float]:
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


def _same_job(job: JobRow, req: Request, registry: Registry) -> bool:
    """Is a setup request for ``job`` a re-run (same owner and directives), not a new job
    that reuses the id?"""
    if (job.uid, job.gid) != (int(req.get("uid", -1)), int(req.get("gid", -1))):
        return False
    parsed = directives.parse(req.get("script", ""), registry)
    mine = [d.spec for d in job.directives]
    return json.dumps(mine, sort_keys=True) == json.dumps(parsed["directives"], sort_keys=True)


def _slurm_value(value: Any) -> str | None:
    """Slurm passes a missing string argument as "(null)"."""
    return None if value in (None, "", "(null)") else str(value)
