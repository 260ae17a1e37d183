"""What users and admins see: status of a job, the job list, pools, and `scontrol show bbstat`."""

from __future__ import annotations

import grp
import pwd
import time
from collections.abc import Callable, Sequence
from typing import Any

from bbstage.config import Config
from bbstage.daemon import scratch
from bbstage.daemon.state import (
    ACTIVE,
    AttemptRow,
    AttemptState,
    DirectiveState,
    JobRow,
    Store,
)
from bbstage.daemon.usage import Usage, Used

# Why a transfer waits, by its key ("job id:directive index"): the executor's ``why``.
Why = Callable[[str], "str | None"]


def _no_wait(_key: str) -> str | None:
    return None


def may_see(config_admin_group: str | None, caller_uid: int, job: JobRow) -> bool:
    """Root, members of the admin group and the job's owner see a job; nobody else."""
    return caller_uid == job.uid or is_admin(config_admin_group, caller_uid)


def is_admin(config_admin_group: str | None, caller_uid: int) -> bool:
    """Root, or a member of the admin group: sees every job."""
    if caller_uid == 0:
        return True
    if not config_admin_group:
        return False
    try:
        group = grp.getgrnam(config_admin_group)
        name = pwd.getpwuid(caller_uid).pw_name
    except KeyError:
        return False
    return name in group.gr_mem or pwd.getpwuid(caller_uid).pw_gid == group.gr_gid


def job_status(
    job: JobRow,
    attempts: Sequence[AttemptRow] = (),
    why: Why = _no_wait,
    used: Used | None = None,
) -> dict[str, Any]:
    """A job's state and one entry per directive, with rate and ETA while it runs, why it
    waits for a slot (``why``: the executor's), and its ``attempts`` on transfer nodes (Dask;
    none with the local engine) and what each node moved."""
    now = time.time()
    rows = []
    for d in job.directives:
        mine = [a for a in attempts if a.idx == d.idx]
        elapsed = ((d.finished or now) - d.started) if d.started else 0.0
        rate = d.bytes_done / elapsed if elapsed > 0 else 0.0
        left = max(0, d.bytes_total - d.bytes_done)
        rows.append(
            {
                "index": d.idx,
                "id": f"{job.job_id}:{d.idx}",
                # script: a directive of the script; copy: `bbstage copy` during the job;
                # at_end: `bbstage copy --at-end`, staged out with the script's stage-outs
                "kind": d.spec.get("origin", "script"),
                "line": d.line,
                "direction": "in" if d.verb == "stage_in" else "out",
                "source": d.source,
                "destination": d.destination,
                "state": d.state,
                "bytes_done": d.bytes_done,
                "bytes_total": d.bytes_total,
                "files_done": d.files_done,
                "files_total": d.files_total,
                "files_skipped": d.files_skipped,
                "rate_bytes_per_s": round(rate, 1),
                "eta_s": round(left / rate, 1) if d.state == "running" and rate > 0 else None,
                "error": d.error,
                "waiting": why(f"{job.job_id}:{d.idx}")
                if d.state == DirectiveState.RUNNING
                else None,
                "nodes": _nodes(mine),
                "attempts": [_attempt(a) for a in mine],
            }
        )
    return {
        "job_id": job.job_id,
        "uid": job.uid,
        "state": job.state,
        "error": job.error,
        "pool": job.pool,
        "capacity": job.size,
        "scratch": job.scratch,
        # what the scratch held at the last measure (bbstage/daemon/usage.py): None unmeasured
        "scratch_used": used.bytes if used else None,
        "scratch_over": bool(used and job.size and used.bytes > job.size),
        "updated": job.updated,
        "directives": rows,
    }


def _nodes(attempts: list[AttemptRow]) -> list[dict[str, Any]]:
    """What each transfer node moved (summed over its attempts), by node name."""
    nodes: dict[str, dict[str, Any]] = {}
    for a in attempts:
        if a.node:
            n = nodes.setdefault(a.node, {"node": a.node, "bytes": 0, "files": 0, "running": False})
            n["bytes"] += a.bytes
            n["files"] += a.files
            n["running"] |= a.state == AttemptState.RUNNING
    return [nodes[name] for name in sorted(nodes)]


def _attempt(a: AttemptRow) -> dict[str, Any]:
    return {
        "id": a.id,
        "shard": a.shard,
        "shards": a.shards,
        "node": a.node,
        "state": a.state,
        "bytes": a.bytes,
        "files": a.files,
        "started": a.started,
        "ended": a.ended,
        "error": a.error,
    }


def jobs_summary(
    jobs: list[JobRow], nodes: dict[str, list[str]] | None = None, why: Why = _no_wait
) -> list[dict[str, Any]]:
    """One row per job; ``nodes``: job id → the transfer nodes its attempts ran on;
    ``waiting``: why its first waiting transfer waits (``why``), if one does."""
    nodes = nodes or {}
    out = []
    for job in jobs:
        ds = job.directives
        waits = (why(f"{job.job_id}:{d.idx}") for d in ds if d.state == DirectiveState.RUNNING)
        out.append(
            {
                "job_id": job.job_id,
                "uid": job.uid,
                "state": job.state,
                "directives": len(ds),
                "done": sum(d.state == "done" for d in ds),
                "bytes_done": sum(d.bytes_done for d in ds),
                "bytes_total": sum(d.bytes_total for d in ds),
                "nodes": nodes.get(job.job_id, []),
                "waiting": next((w for w in waits if w), None),
            }
        )
    return out


def pools(config: Config, store: Store, usage: Usage | None = None) -> dict[str, dict[str, int]]:
    """Each pool's capacity and reservations; with ``usage``, what its jobs' scratch holds
    (``used``) and how many of them hold more than they reserved (``over``)."""
    rows = scratch.in_use(config.pools, store.reserved())
    if usage is not None:
        jobs = [j for j in store.jobs(ACTIVE) if j.scratch and j.pool]
        used = usage.of_pools({j.job_id: j.pool for j in jobs if j.pool})
        over = usage.over({j.job_id: j.size for j in jobs if j.size})
        pool_of = {j.job_id: j.pool for j in jobs}
        for name, row in rows.items():
            row["used"] = used.get(name, 0)
            row["over"] = sum(1 for j in over if pool_of.get(j) == name)
    return rows


def bbstat(store: Store, args: list[str], uid: str | None) -> str:
    """Text for `scontrol show bbstat [JOBID]`.

    Slurm 22.05 does not tell the hook who asks, so without a uid this shows states and
    byte counts but never a path; with a uid (24.05+) the caller's own jobs show in full.
    """
    job_ids = [a for a in args if a.isdigit()]
    jobs = (
        [j for j in (store.job(i) for i in job_ids) if j]
        if job_ids
        else (store.jobs(("setup", "staging_in", "staged_in", "running", "staging_out")))
    )
    lines = [f"{'JOBID':>8} {'STATE':<12} {'DONE':>9} {'BYTES':>20}"]
    for job in jobs:
        s = jobs_summary([job])[0]
        lines.append(
            f"{job.job_id:>8} {job.state:<12} {s['done']:>4}/{s['directives']:<4}"
            f" {s['bytes_done']:>9}/{s['bytes_total']:<10}"
        )
        full = uid is not None and uid.isdigit() and may_see(None, int(uid), job)
        for d in job.directives if full else []:
            lines.append(f"{'':>8}   #{d.idx} {d.verb} {d.source} -> {d.destination}: {d.state}")
    return "\n".join(lines) + "\n"
