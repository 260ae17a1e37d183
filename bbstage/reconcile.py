"""Reconcile with slurmctld: tear down staging for jobs that Slurm no longer runs.

Slurm may never deliver a teardown: on 22.05 an `scancel` during stage-in kills the
data_in hook *and* the teardown it has just started ("teardown ... terminated by
slurmctld"), and a daemon that was down misses every hook sent meanwhile. So every
``reconcile_interval`` seconds the daemon asks `squeue` about the jobs it is staging and
runs teardown(hurry=true) itself for a job that is dead before it ran, or gone from Slurm.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import structlog

from bbstage.engine import Engine
from bbstage.protocol import Request

log = structlog.get_logger("bbstage.reconcile")

BEFORE_RUN = ("setup", "staging_in", "staged_in")
AFTER_RUN = ("running", "staging_out", "staged_out")
# Slurm job states after which a job that had not yet run never will.
DEAD = {
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT",
}  # fmt: skip


async def slurm_states(job_ids: list[str], slurm_conf: str | None) -> dict[str, str] | None:
    """Job id → Slurm state for the jobs slurmctld still knows; None if it cannot be asked."""
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    proc = await asyncio.create_subprocess_exec(
        # %A: the job's own id, also for an array task (%i would print "<array id>_<index>",
        # which never matches the id the hooks gave us: every task looked gone).
        squeue, "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%A %T",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    # squeue exits 1 with "Invalid job id specified" when none of the ids exists any more.
    if proc.returncode and b"Invalid job id" not in err:
        log.warning("squeue failed", error=err.decode(errors="replace").strip())
        return None
    states = {}
    for line in out.decode().splitlines():
        job_id, _, state = line.partition(" ")
        states[job_id.strip()] = state.strip()
    return states


# A job squeue does not list must stay unlisted this long before it counts as gone: Slurm
# runs setup for an array task before squeue can find the task by its own id.
MISSING_GRACE = 120.0


async def once(engine: Engine, missing: dict[str, float] | None = None) -> list[str]:
    """One pass; returns the job ids torn down. ``missing``: job id → when first unlisted,
    carried from pass to pass."""
    missing = {} if missing is None else missing
    jobs = engine.store.jobs(BEFORE_RUN + AFTER_RUN)
    if not jobs:
        missing.clear()
        return []
    conf = str(engine.config.slurm_conf) if engine.config.slurm_conf else None
    states = await slurm_states([j.job_id for j in jobs], conf)
    if states is None:
        return []
    now = time.monotonic()
    for job_id in list(missing):
        if job_id in states or all(j.job_id != job_id for j in jobs):
            del missing[job_id]
    orphans = []
    for j in jobs:
        if j.job_id in states:
            if j.state in BEFORE_RUN and states[j.job_id] in DEAD:
                orphans.append(j.job_id)  # Slurm says so: act now
        elif now - missing.setdefault(j.job_id, now) >= MISSING_GRACE:
            orphans.append(j.job_id)
    for job_id in orphans:
        log.warning("slurm no longer runs this job: tearing down", job_id=job_id,
                    slurm_state=states.get(job_id, "gone"))  # fmt: skip
        await engine.handle(Request("teardown", {"job_id": job_id, "hurry": True}))
        missing.pop(job_id, None)
    return orphans


async def forever(engine: Engine) -> None:
    interval = engine.config.reconcile_interval
    if interval <= 0:
        return
    missing: dict[str, float] = {}
    while True:
        await asyncio.sleep(interval)
        try:
            await once(engine, missing)
            await engine.purge_expired()
        except Exception:
            log.exception("reconcile failed")
