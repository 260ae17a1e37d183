"""The job lifecycle's decisions, as pure functions (after dask ``distributed``'s
``worker_state_machine.py``): each takes a job as the store last gave it and an event, and
returns a ``Decision``: the job as its actions leave it, and the actions, which the engine
carries out in order (``Engine._do``: the store's writes, transfers to start, events...).
Nothing here reads or writes the store, starts a transfer or logs: tests call these with
rows they build (tests/unit/test_lifecycle.py).

The phases and their order are ``state.LIFECYCLE``'s, written once there.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from bbstage.daemon.events import EngineEvent, TransferEnded
from bbstage.daemon.state import (
    FINISHED,
    ORDER,
    PHASES,
    UNFINISHED,
    DirectiveRow,
    DirectiveState,
    JobRow,
    JobState,
    as_stored,
)
from bbstage.movers import Cancelled, TransferError, retrying
from bbstage.protocol import OK, Reply, bounded
from bbstage.transfer import Done, Planned

ATTEMPTS = retrying.TRANSFER.tries  # a transfer that fails transiently is run again
# An in-job copy (`bbstage copy`, no --at-end) is a directive of this verb, added while the job
# runs; it is one of the job's outputs: its stage-out waits for it (``of_phase``). A copy
# --at-end is a plain stage_out added at run time.
COPY = "copy"


class Refused(Exception):
    """A request the engine answers "no" to, with the reason for whoever sent it (a script's
    error, an unknown pool, a job not running...). Not a ``ValueError``: any other exception
    in a handler is a bug in the daemon, and is answered as one (``Engine.handle``)."""


# -- actions: what a decision asks the engine to do, in order -------------------------------


@dataclass(frozen=True)
class SetJob:
    """Write the job's columns (``Store.set_job``: a new state by a legal move only)."""

    job_id: str
    values: dict[str, Any]


@dataclass(frozen=True)
class SetDirective:
    """Write a directive's columns (``Store.set_directive``)."""

    job_id: str
    idx: int
    values: dict[str, Any]


@dataclass(frozen=True)
class Start:
    """Start the directive's transfer (its ``tries``-th try), or join the one running."""

    job_id: str
    idx: int
    tries: int = 1


@dataclass(frozen=True)
class MarkStaged:
    """Write the stage-in mark the hooks read without asking (``staged.mark``)."""

    job_id: str


@dataclass(frozen=True)
class Emit:
    """Tell the engine's subscribers (``events.py``)."""

    event: EngineEvent


@dataclass(frozen=True)
class Note:
    """A line of the daemon's log."""

    level: str  # "info", "warning"
    event: str
    fields: dict[str, Any] = field(default_factory=dict)


Action = SetJob | SetDirective | Start | MarkStaged | Emit | Note


@dataclass(frozen=True)
class Decision:
    job: JobRow | None  # the job as the actions leave it (None: it has no record)
    actions: tuple[Action, ...] = ()

    def then(self, later: Decision) -> Decision:
        """This decision's actions, then ``later``'s (decided on this one's job)."""
        return Decision(later.job, self.actions + later.actions)


@dataclass(frozen=True)
class Ended:
    """The event of a transfer's end (not one stopped by a shutdown: nothing is decided)."""

    job_id: str
    idx: int
    verb: str
    outcome: Done | BaseException  # the worker's manifest, or why it failed
    plan: Planned | None  # its worker's final plan, if its walk ended
    counts: dict[str, int]  # its latest counts (Planned, Moved)
    tries: int
    now: float


# -- the phases --------------------------------------------------------------------------


def of_phase(d: DirectiveRow, verb: str) -> bool:
    """Does ``d`` belong to ``verb``'s phase? An in-job copy is one of the job's outputs."""
    return d.verb == verb or (verb == "stage_out" and d.verb == COPY)


def failed(d: DirectiveRow) -> bool:
    """Does ``d`` fail its phase? A copy the user cancelled (``bbstage cancel``) does not."""
    return d.state == DirectiveState.FAILED or (
        d.state == DirectiveState.CANCELLED and not added(d)
    )


def added(d: DirectiveRow) -> bool:
    """Was ``d`` added at run time (``bbstage copy``, with or without --at-end)?"""
    return bool(d.spec.get("origin"))


def past(state: JobState, other: JobState) -> bool:
    """Is a job in ``state`` past ``other`` in the lifecycle (an ended job is past all)?"""

    def rank(s: JobState) -> int:
        return ORDER.index(s) if s in ORDER else len(ORDER)

    return rank(state) > rank(other)


def begin(job: JobRow, verb: str, running: Collection[int], tearing: bool) -> Decision:
    """A hook asks for ``verb``'s phase (data_in, data_out): enter it if the job is before
    it, and start or join its transfers (``start_phase``); a job past it (a hook sent again
    late) is answered from the record."""
    phase = PHASES[verb]
    if past(job.state, phase.reached):
        return Decision(job)
    entered = Decision(job)
    if job.state not in (phase.entered, phase.reached):
        entered = _set_job(job, state=phase.entered, error="")
    assert entered.job is not None
    return entered.then(start_phase(entered.job, verb, running, tearing))


def start_phase(job: JobRow, verb: str, running: Collection[int], tearing: bool) -> Decision:
    """Start (or join) every unfinished directive of one direction; ``running``: the indexes
    whose transfer runs. Nothing (left) to move: the phase is settled."""
    starts: list[Action] = []
    for d in job.directives:
        if not of_phase(d, verb) or d.state == DirectiveState.DONE:
            continue
        ended = d.state in (DirectiveState.FAILED, DirectiveState.CANCELLED)
        if ended and d.idx not in running:
            continue  # a recorded failure (or a cancelled copy) stands until teardown
        starts.append(Start(job.job_id, d.idx))
    if starts:
        return Decision(job, tuple(starts))
    return settle(job, verb, tearing)


def resume(job: JobRow, running: Collection[int], tearing: bool) -> Decision:
    """After a restart: the transfers under way start again (a staging phase's, or a running
    job's in-job copies)."""
    if job.state in (JobState.STAGING_IN, JobState.STAGING_OUT):
        verb = "stage_in" if job.state == JobState.STAGING_IN else "stage_out"
        note = Note("info", "resuming", {"job_id": job.job_id, "phase": verb})
        return Decision(job, (note,)).then(start_phase(job, verb, running, tearing))
    actions: list[Action] = []
    if job.state == JobState.RUNNING:  # its in-job copies under way
        for d in job.directives:
            if d.verb == COPY and d.state in UNFINISHED:
                actions += [Note("info", "resuming", {"job_id": job.job_id, "copy": d.idx}),
                            Start(job.job_id, d.idx)]  # fmt: skip
    return Decision(job, tuple(actions))


def settle(job: JobRow | None, verb: str, tearing: bool) -> Decision:
    """Move the job to ``staged_*`` or ``failed`` once a direction has finished (not while
    its teardown decides its end: ``tearing``)."""
    verb = "stage_out" if verb == COPY else verb
    phase = PHASES[verb]
    if job is None or job.state != phase.entered or tearing:
        return Decision(job)
    mine = [d for d in job.directives if of_phase(d, verb)]
    if any(d.state in UNFINISHED for d in mine):
        return Decision(job)
    failing = [d for d in mine if failed(d)]
    if failing:
        return _set_job(job, state=JobState.FAILED, error=describe(failing[0]))
    reached = _set_job(job, state=phase.reached)
    if verb == "stage_in":
        return reached.then(Decision(reached.job, (MarkStaged(job.job_id),)))
    return reached


def transfer_ended(job: JobRow | None, end: Ended, tearing: bool) -> Decision:
    """Record a transfer's outcome: done only from the worker's manifest, and only if it
    covers everything the worker planned; a transient failure is tried again (up to
    ``ATTEMPTS``); then the transfer's event, and the phase settled."""
    job_id = end.job_id
    exc = end.outcome if isinstance(end.outcome, BaseException) else None
    done = end.outcome if isinstance(end.outcome, Done) else None
    if done is not None:
        plan = end.plan
        if plan is None or not done.covers(plan):
            exc = TransferError(
                f"incomplete: the worker committed {done.files} files ({done.bytes} bytes)"
                f" of the {plan.files if plan else '?'} files"
                f" ({plan.bytes if plan else '?'} bytes) it planned"
            )
    error = bounded(str(exc)) if exc is not None else ""  # for the log (the store bounds)
    where = {"job_id": job_id, "directive": end.idx}
    if exc is None:
        assert done is not None
        state = DirectiveState.DONE
        counts = end.counts | {"bytes_done": done.bytes, "files_done": done.files}  # manifest's
        values = {"state": state, "finished": end.now, **counts}
        notes = [Note("info", "transfer done", where)]
    else:
        transient = isinstance(exc, TransferError) and not exc.permanent
        if transient and end.tries < ATTEMPTS and job is not None:
            again = Note("warning", "transfer failed, trying again",
                         {**where, "attempt": end.tries, "error": error})  # fmt: skip
            return Decision(job, (again, Start(job_id, end.idx, end.tries + 1)))
        state = DirectiveState.CANCELLED if isinstance(exc, Cancelled) else DirectiveState.FAILED
        values = {"state": state, "error": str(exc), "finished": end.now, **end.counts}
        notes = [Note("warning", "transfer failed", {**where, "error": error})]
    if job is None:  # gone meanwhile: written as before, nothing to tell or settle
        return Decision(None, (SetDirective(end.job_id, end.idx, values), *notes))
    job = _with_directive(job, end.idx, values)
    actions: list[Action] = [SetDirective(job_id, end.idx, values), *notes]
    row = next((r for r in job.directives if r.idx == end.idx), None)
    if row is not None:
        direction = "in" if end.verb == "stage_in" else "out"
        elapsed = end.now - (row.started or end.now)
        ended = TransferEnded(direction, state, elapsed, row.bytes_done, row.files_done, job.uid)
        actions.append(Emit(ended))
    return Decision(job, tuple(actions)).then(settle(job, end.verb, tearing))


def verdict(job: JobRow, verb: str) -> Reply:
    """What test_data_in / test_data_out (and a blocking data_in's end) answer: done, still
    busy, or the first failing line."""
    mine = [d for d in job.directives if of_phase(d, verb)]
    failing = [d for d in mine if failed(d)]
    if failing:
        # The first failing line of the script, not whichever failed first: a line above
        # it still running may fail too (the hold's reason is given once).
        if any(d.state in UNFINISHED for d in mine if d.idx < failing[0].idx):
            return Reply.busy()
        return Reply.error(describe(failing[0]))
    if all(d.state in (DirectiveState.DONE, DirectiveState.CANCELLED) for d in mine):
        return Reply.ok()
    return Reply.busy()


def start_run(job: JobRow) -> Decision:
    """pre_run: the job starts, once its stage-in has finished; else ``Refused``."""
    if job.state in FINISHED:
        # Torn down before it ran (its scratch is gone): Slurm lost track of it, e.g. a
        # slurmctld restart while its stage-in hook ran. A new setup makes a new record.
        raise Refused(
            f"job {job.job_id} was torn down before it started ({job.state}):"
            " its staged inputs are gone; requeue or resubmit it"
        )
    waiting = job.state in (JobState.SETUP, JobState.STAGING_IN)
    if waiting or verdict(job, "stage_in").status != OK:
        raise Refused(f"job {job.job_id}: its stage-in has not finished ({job.state})")
    if job.state == JobState.STAGED_IN:  # not a re-run of pre_run (running or later)
        return _set_job(job, state=JobState.RUNNING)
    return Decision(job)


# -- the end -----------------------------------------------------------------------------


def outputs_at_risk(job: JobRow) -> bool:
    """Does scratch hold results not yet staged out? A stage-out from it started and did
    not finish, or the job ran (or was running when torn down) and one never started."""
    ran = job.state in (JobState.RUNNING, JobState.STAGING_OUT)
    return any(
        of_phase(d, "stage_out")
        and d.spec.get("source_kind") == "scratch"
        and (
            d.state in (DirectiveState.RUNNING, DirectiveState.FAILED)
            or (ran and d.state == DirectiveState.PENDING)
            or failed(d)
        )
        for d in job.directives
    )


def keep_scratch(job: JobRow, current: JobRow, retention_days: float) -> Decision | None:
    """A teardown's verdict on the scratch of ``job`` (as it was before the teardown's
    transfers stopped): kept, the job (``current``: as it is now) failed with why; or None,
    to remove it."""
    if job.origin != "setup":
        # Recreated after the daemon lost its state: whatever scratch holds is not ours
        # to judge, so it stays (an admin removes it; `bbstage jobs` lists it).
        where = {"job_id": job.job_id, "scratch": job.scratch}
        note = Note("warning", "scratch kept", {**where, "reason": "recovered"})
        failing = fail(current, f"state was lost: scratch {job.scratch} kept")
        return Decision(failing.job, (*failing.actions, note))
    if outputs_at_risk(job):
        # Never delete results that did not reach their destination.
        error = f"stage-out incomplete: outputs kept in {job.scratch} for {retention_days:g} days"
        note = Note("warning", "scratch kept", {"job_id": job.job_id, "scratch": job.scratch})
        failing = fail(current, error)
        return Decision(failing.job, (*failing.actions, note))
    return None


def end(job: JobRow, hurry: bool) -> Decision:
    """The end of a teardown that removed the scratch: done, or cancelled (``hurry``)
    before its stage-out ended; a job already ended (by another teardown) stays so."""
    if job.state in FINISHED:
        return Decision(job)
    hurried = hurry and job.state != JobState.STAGED_OUT
    return _set_job(job, state=JobState.CANCELLED if hurried else JobState.DONE)


def fail(job: JobRow, error: str) -> Decision:
    """Fail ``job`` with ``error`` added to its own (a failed job just gets the error)."""
    if job.state == JobState.FAILED:
        return _set_job(job, error=_join(job.error, error))
    return _set_job(job, state=JobState.FAILED, error=_join(job.error, error))


def describe(d: DirectiveRow) -> str:
    """A failed directive, for the job's error: its line of the script, or which copy."""
    if d.spec.get("origin"):  # bbstage copy: no line of the script
        what = "copy --at-end" if d.verb == "stage_out" else "in-job copy"
        return f"{what} {d.idx} ({d.source} -> {d.destination}): {d.error or d.state}"
    return f"{d.verb} line {d.line}: {d.error or d.state}"


# -- the job as the actions leave it ------------------------------------------------------


def _set_job(job: JobRow, **values: Any) -> Decision:
    """Write ``values`` to the job: the action, and the job as it then reads."""
    stored = as_stored(values)
    if "state" in stored:
        stored["state"] = JobState(stored["state"])
    return Decision(replace(job, **stored), (SetJob(job.job_id, values),))


def _with_directive(job: JobRow, idx: int, values: dict[str, Any]) -> JobRow:
    """The job once ``values`` are written to its directive ``idx``."""
    stored = as_stored(values)
    if "state" in stored:
        stored["state"] = DirectiveState(stored["state"])
    rows = [replace(d, **stored) if d.idx == idx else d for d in job.directives]
    return replace(job, directives=rows)


def _join(*errors: str) -> str:
    return "; ".join(e for e in errors if e)
