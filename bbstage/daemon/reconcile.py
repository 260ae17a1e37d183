"""Reconcile with slurmctld: tear down staging for jobs that Slurm no longer runs.

Slurm may never deliver a teardown: an `scancel` of a pending job flushes its scripts while
it queues the job's teardown, so the data_in hook *and* that teardown die ("teardown ...
terminated by slurmctld"; at times, on 22.05 and 24.11), and a daemon that was down
misses every hook sent meanwhile. So every ``reconcile_interval`` seconds the daemon asks
`squeue` about the jobs it is staging and runs teardown(hurry=true) itself for a job that is
dead before it ran, or gone from Slurm. The jobs being staged in are asked about every
``STAGE_IN_WATCH`` seconds too: their copies must stop within 2 s of an `scancel` whose
teardown Slurm killed. That quick check asks for states only, which Slurm 24.05+ answers
for just those jobs (`squeue --only-job-state`; with ``SlurmctldParameters=
enable_job_state_cache`` without its job lock); an older squeue dumps every job of the
cluster for a list of ids, so where a call is slow the check runs less often (its calls
take at most ``WATCH_SHARE`` of the time).

It also ends jobs Slurm has *stranded*. Slurm 24.11 saves its job records before its burst
buffer records when it stops; if a stage-in hook fails in that moment (slurmscriptd reports
a hook it killed on shutdown as failed), the teardown that follows frees the buffer record
while the saved job still says ``staging-in``. After the restart no thread stages that job
and nothing moves it on: it stays PENDING with reason ``BurstBufferStageIn`` for ever. The
daemon knows such a job as cancelled (it got that teardown). A job we hold as cancelled that
Slurm keeps waiting for a stage-in for ``STRANDED_GRACE`` seconds is cancelled in Slurm with
the reason in the daemon's record (`bbstage status`): a clear failure instead of a job that
waits for ever. Slurm offers no way to restart its stage-in (`scontrol requeue` refuses a
pending job; the burst buffer of a pending job cannot be changed).

The same race can end the other way (seen on 26.05.5, the code is the same in 24.11):
slurmscriptd ends a stage-in hook at shutdown without marking it as killed by slurmctld,
Slurm takes that as the hook failing, with whatever message the hook had written (none, or
the ``BUSY`` of a poll that had answered), holds the job (priority 0), tears it down
(``TeardownFailure``) and saves it held: it stays PENDING with reason
``burst_buffer/lua: JobHeldAdmin: slurm_bb_test_data_in failed: `` or ``... failed: BUSY``
(24.11 and 22.05: ``burst_buffer/lua: slurm_bb_test_data_in: ``) until someone runs
``scontrol release``. A failure bbstage answers always carries a message, never ``BUSY``
alone (that is a success), so a stage-in hook's failure with no message or with ``BUSY`` is
Slurm's doing: a job held for that, for which the daemon never recorded a failed stage-in,
is released (``scontrol release``; Slurm stages it again from the start), once
per job while the daemon runs. The jobs come from the whole pass's `squeue` (the jobs the
daemon stages and those it tore down in the last hour) and, for a job the daemon has no
record of, from one `squeue -t PD` every ``HELD_SCAN`` seconds (less often where it is slow).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import structlog

from bbstage.daemon.engine import Engine
from bbstage.daemon.state import DirectiveState, JobRow, JobState

log = structlog.get_logger("bbstage.daemon.reconcile")

BEFORE_RUN = (JobState.SETUP, JobState.STAGING_IN, JobState.STAGED_IN)
AFTER_RUN = (JobState.RUNNING, JobState.STAGING_OUT, JobState.STAGED_OUT)
# Slurm job states after which a job that had not yet run never will.
DEAD = {
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT",
}  # fmt: skip
# What squeue shows for a job whose stage-in Slurm believes is under way.
STAGING_IN = ("PENDING", "BurstBufferStageIn")
# Jobs being staged in are asked about this often (seconds), whatever reconcile_interval is...
STAGE_IN_WATCH = 0.5
# ...or less often, so that those squeue calls take at most this share of the time.
WATCH_SHARE = 0.05
# ...judged by the fastest of this many calls.
PACE_CALLS = 5
# Cancelled jobs younger than this are watched for being stranded.
STRANDED_WATCH = 3600.0
# A job we cancelled that Slurm waits this long for its stage-in is stranded. A real stage-in
# sends setup within milliseconds of Slurm's entering that state (and replaces our record).
STRANDED_GRACE = 60.0

# The pending jobs of the whole cluster are listed this often (seconds), to find the jobs Slurm
# held for a stage-in hook it killed (the module's docstring) that the daemon has no record of.
HELD_SCAN = 60.0
# Slurm's reason for a job held because a stage-in hook it killed "failed": 24.11 (and 22.05)
# "burst_buffer/lua: <hook>: ", 26.05 "burst_buffer/lua: JobHeldAdmin: <hook> failed: "
# (_fail_stage), then the message the hook had written before it died: none, or the "BUSY"
# of a poll (a success: bbstage never fails with that message). The stage-in hooks are those
# of Slurm's _start_stage_in.
_STAGE_IN_HOOKS = "slurm_bb_(?:setup|data_in|test_data_in|real_size)"
HELD_FOR_A_KILLED_HOOK = re.compile(
    rf"burst_buffer/lua: (?:JobHeldAdmin: {_STAGE_IN_HOOKS} failed|{_STAGE_IN_HOOKS}):"
    r"\s*(?:BUSY\s*)?"
)


class SlurmJob(NamedTuple):
    state: str  # squeue's %T: PENDING, RUNNING, CANCELLED...
    reason: str = ""  # squeue's %r


# A Slurm command that has not answered in this many seconds is killed and counts as failed
# (its own retries against an unreachable slurmctld end well before).
SLURM_TIMEOUT = 120.0


async def _slurm(tool: str, args: list[str], slurm_conf: str | None) -> tuple[int, bytes, bytes]:
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    proc = await asyncio.create_subprocess_exec(
        tool, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), SLURM_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, b"", f"no answer in {SLURM_TIMEOUT:g} s".encode()
    return proc.returncode or 0, out, err


# The squeue programs that refused --only-job-state (Slurm before 24.05).
_NO_STATE_ONLY: set[str] = set()


async def slurm_states(
    job_ids: list[str], slurm_conf: str | None, warn: bool = True, states_only: bool = False
) -> dict[str, SlurmJob] | None:
    """Job id → Slurm state for the jobs slurmctld still knows; None (and a warning if
    ``warn``) if it cannot be asked. ``states_only``: no reasons, through the job-state RPC
    where squeue offers it (24.05+: only these jobs, from a cache if slurmctld keeps one)."""
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    # %A: the job's own id, also for an array task (%i would print "<array id>_<index>",
    # which never matches the id the hooks gave us: every task looked gone).
    args = ["-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%A %T %r"]
    if states_only and squeue not in _NO_STATE_ONLY:
        light = ["--only-job-state", *args[:-1], "%A %T"]
        code, out, err = await _slurm(squeue, light, slurm_conf)
        if b"unrecognized option" in err:
            _NO_STATE_ONLY.add(squeue)
            code, out, err = await _slurm(squeue, args, slurm_conf)
    else:
        code, out, err = await _slurm(squeue, args, slurm_conf)
    # squeue exits 1 with "Invalid job id specified" when none of the ids exists any more.
    if code and b"Invalid job id" not in err:
        if warn:
            log.warning("squeue failed", error=err.decode(errors="replace").strip())
        return None
    states = {}
    for line in out.decode(errors="replace").splitlines():
        job_id, state, reason = (line.split(" ", 2) + ["", ""])[:3]
        states[job_id.strip()] = SlurmJob(state.strip(), reason.strip())
    return states


async def cancel_in_slurm(job_id: str, slurm_conf: str | None) -> bool:
    """``scancel JOB``; whether slurmctld took it."""
    return await _act_in_slurm(job_id, slurm_conf, "scancel", [], "end a stranded job")


async def release_in_slurm(job_id: str, slurm_conf: str | None) -> bool:
    """``scontrol release JOB``; whether slurmctld took it."""
    return await _act_in_slurm(job_id, slurm_conf, "scontrol", ["release"], "release the job")


async def _act_in_slurm(
    job_id: str, slurm_conf: str | None, tool: str, verb: list[str], what: str
) -> bool:
    """``TOOL VERB JOB`` for one job id from a hook or squeue; whether slurmctld took it
    (what it could not do is logged: an admin then does it by hand)."""
    if not job_id.isdigit():  # never an option or a list
        log.error(f"not a job id: cannot {what}", job_id=job_id)
        return False
    path = shutil.which(tool)
    if path is None:
        log.error(f"{tool} not found: cannot {what}", job_id=job_id)
        return False
    code, _, err = await _slurm(path, [*verb, job_id], slurm_conf)
    if code:
        log.error(f"{' '.join([tool, *verb])} failed: {what} by hand", job_id=job_id,
                  error=err.decode(errors="replace").strip())  # fmt: skip
    return code == 0


async def held_in_slurm(slurm_conf: str | None) -> dict[str, SlurmJob] | None:
    """The pending jobs of the cluster whose reason is burst_buffer/lua's (one `squeue -t PD`);
    None if slurmctld cannot be asked."""
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    code, out, _ = await _slurm(squeue, ["-h", "-t", "PD", "-o", "%A %T %r"], slurm_conf)
    if code:
        return None  # the whole pass reports a slurmctld that does not answer
    held = {}
    for line in out.decode(errors="replace").splitlines():
        job_id, state, reason = (line.split(" ", 2) + ["", ""])[:3]
        if reason.startswith("burst_buffer/lua:"):
            held[job_id.strip()] = SlurmJob(state.strip(), reason)
    return held


def held_for_a_killed_hook(slurm: SlurmJob) -> bool:
    """Is the job held by Slurm for a stage-in hook it killed (``HELD_FOR_A_KILLED_HOOK``)?"""
    return slurm.state == "PENDING" and HELD_FOR_A_KILLED_HOOK.fullmatch(slurm.reason) is not None


def _failed_here(engine: Engine, job_id: str) -> bool:
    """Did the daemon record a failed stage-in for the job (which it answers as an error, with
    a message)? A job it has no record of, or whose transfers were only cancelled (the
    teardown that follows Slurm's hold), did not fail here."""
    job = engine.job(job_id)
    return job is not None and any(
        d.verb == "stage_in" and d.state == DirectiveState.FAILED for d in job.directives
    )


async def release_held(
    engine: Engine, slurm: dict[str, SlurmJob], released: set[str], conf: str | None
) -> list[str]:
    """Release in Slurm the jobs of ``slurm`` that it held for a stage-in hook it killed (the
    module's docstring), each once: ``released`` holds the ids released already; their ids."""
    done = []
    for job_id in sorted(slurm):
        if job_id in released or not held_for_a_killed_hook(slurm[job_id]):
            continue
        if _failed_here(engine, job_id):
            continue  # a failure of ours (Slurm would show its message): the job stays held
        released.add(job_id)  # once, whatever scontrol answers: never a loop
        log.warning("slurm held the job for a stage-in hook it killed: releasing it",
                    job_id=job_id, reason=slurm[job_id].reason.strip())  # fmt: skip
        if await release_in_slurm(job_id, conf):
            done.append(job_id)
    return done


async def held(engine: Engine, released: set[str], pace: Pace | None = None) -> list[str]:
    """List the cluster's pending jobs (timed by ``pace``) and release those Slurm held for a
    stage-in hook it killed; their ids."""
    conf = str(engine.config.slurm_conf) if engine.config.slurm_conf else None
    started = time.monotonic()
    found = await held_in_slurm(conf)
    if pace is not None:
        pace.took(time.monotonic() - started)
    return await release_held(engine, found or {}, released, conf)


# A job squeue does not list must stay unlisted this long before it counts as gone: Slurm
# runs setup for an array task before squeue can find the task by its own id.
MISSING_GRACE = 120.0


async def once(
    engine: Engine,
    missing: dict[str, float] | None = None,
    stranded: dict[str, float] | None = None,
    released: set[str] | None = None,
) -> list[str]:
    """One pass; returns the job ids torn down, cancelled or released. ``missing``: job id →
    when first unlisted; ``stranded``: job id → when first seen stranded; ``released``: the
    jobs released from a hold already (``release_held``); all carried between passes."""
    missing = {} if missing is None else missing
    stranded = {} if stranded is None else stranded
    released = set() if released is None else released
    jobs = engine.jobs(BEFORE_RUN + AFTER_RUN)
    since = time.time() - STRANDED_WATCH
    cancelled = engine.jobs((JobState.CANCELLED,), updated_since=since)
    if not jobs and not cancelled:
        missing.clear()
        stranded.clear()
        return []
    conf = str(engine.config.slurm_conf) if engine.config.slurm_conf else None
    states = await slurm_states([j.job_id for j in jobs + cancelled], conf)
    if states is None:
        return []
    now = time.monotonic()
    for job_id in list(missing):
        if job_id in states or all(j.job_id != job_id for j in jobs):
            del missing[job_id]
    orphans = []
    for j in jobs:
        if j.job_id in states:
            if j.state in BEFORE_RUN and states[j.job_id].state in DEAD:
                orphans.append(j.job_id)  # Slurm says so: act now
        elif now - missing.setdefault(j.job_id, now) >= MISSING_GRACE:
            orphans.append(j.job_id)
    for job_id in orphans:
        await _tear_down(engine, job_id, states.get(job_id))
        missing.pop(job_id, None)
    ended = await _end_stranded(engine, cancelled, states, stranded, now, conf)
    return orphans + ended + await release_held(engine, states, released, conf)


class Pace:
    """The pause before the next quick check: ``STAGE_IN_WATCH``, or longer where squeue is
    slow, so that the calls take at most ``WATCH_SHARE`` of the time. Slow means the fastest
    of the last ``PACE_CALLS`` calls: one slow call (a squeue whose libraries were evicted
    from the page cache, a busy machine: 2.7 s to see an scancel in CI) does not stretch
    the pause, a squeue that dumps a big cluster's jobs every time does."""

    def __init__(self, base: float | None = None) -> None:
        self.base = STAGE_IN_WATCH if base is None else base  # the pause for a fast squeue
        self.seconds = self.base
        self._calls: deque[float] = deque(maxlen=PACE_CALLS)

    def took(self, seconds: float) -> None:
        """The last call took ``seconds``. Until ``PACE_CALLS`` calls are known the pause
        stays the base one: the first call after a start (libraries not yet in the page
        cache: 0.35 s in CI) once made the next pause 7 s, and a cancel whose teardown
        Slurm lost took 8.3 s to stop the copy."""
        self._calls.append(seconds)
        if len(self._calls) < PACE_CALLS:
            return
        self.seconds = max(self.base, min(self._calls) / WATCH_SHARE)


async def stage_ins(engine: Engine, pace: Pace | None = None) -> list[str]:
    """Tear down the jobs being staged in that Slurm says will never run (one `squeue`, none
    if no job is being staged in, timed by ``pace``); their ids."""
    jobs = engine.jobs((JobState.STAGING_IN,))
    if not jobs:
        return []
    conf = str(engine.config.slurm_conf) if engine.config.slurm_conf else None
    # Quiet: a slurmctld that does not answer is reported by the whole pass, not twice a second.
    started = time.monotonic()
    answer = await slurm_states([j.job_id for j in jobs], conf, warn=False, states_only=True)
    if pace is not None:
        pace.took(time.monotonic() - started)
    states = answer or {}
    dead = [j.job_id for j in jobs if j.job_id in states and states[j.job_id].state in DEAD]
    # At once: each waits for its copies to stop (an scancel of a whole job array).
    await asyncio.gather(*(_tear_down(engine, job_id, states[job_id]) for job_id in dead))
    return dead


async def _tear_down(engine: Engine, job_id: str, slurm: SlurmJob | None) -> None:
    log.warning("slurm no longer runs this job: tearing down", job_id=job_id,
                slurm_state=slurm.state if slurm else "gone")  # fmt: skip
    await engine.end_job(job_id, hurry=True)


async def _end_stranded(
    engine: Engine,
    cancelled: list[JobRow],
    states: dict[str, SlurmJob],
    stranded: dict[str, float],
    now: float,
    conf: str | None,
) -> list[str]:
    """Cancel in Slurm the jobs we hold as cancelled that Slurm keeps waiting for a stage-in
    (see the module's docstring)."""
    waiting = {j.job_id for j in cancelled if tuple(states.get(j.job_id, ())) == STAGING_IN}
    for job_id in list(stranded):
        if job_id not in waiting:
            del stranded[job_id]
    ended = []
    for job_id in sorted(waiting):
        if now - stranded.setdefault(job_id, now) < STRANDED_GRACE:
            continue
        error = (
            "Slurm lost this job's stage-in (slurmctld stopped while a stage-in hook ran) and"
            " would keep it pending for ever: bbstage cancelled it; submit it again"
        )
        log.error("stranded job: cancelling it in slurm", job_id=job_id)
        engine.fail_job(job_id, error)
        if await cancel_in_slurm(job_id, conf):
            ended.append(job_id)
        del stranded[job_id]
    return ended


async def forever(engine: Engine) -> None:
    """Reconcile every ``reconcile_interval`` seconds, check the jobs being staged in as
    often as their ``Pace`` says (``STAGE_IN_WATCH``), and the cluster's held jobs as often as
    theirs says (``HELD_SCAN``); never if the interval is 0."""
    interval = engine.config.reconcile_interval
    if interval <= 0:
        return
    missing: dict[str, float] = {}
    stranded: dict[str, float] = {}
    released: set[str] = set()
    pace = Pace()
    held_pace = Pace(HELD_SCAN)

    async def whole() -> None:
        await once(engine, missing, stranded, released)
        await engine.purge_expired()

    await asyncio.gather(
        _every(lambda: interval, whole),
        _every(lambda: min(interval, pace.seconds), lambda: stage_ins(engine, pace)),
        _every(lambda: max(interval, held_pace.seconds), lambda: held(engine, released, held_pace)),
    )


async def _every(seconds: Callable[[], float], check: Callable[[], Awaitable[object]]) -> None:
    while True:
        await asyncio.sleep(seconds())
        try:
            await check()
        except Exception:
            log.exception("reconcile failed")
