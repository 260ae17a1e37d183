"""Is job J running in Slurm, and owned by uid U? Asked before an in-job copy starts
(``[daemon] job_check = "slurm"``), as the reconciler asks: one ``squeue`` for one job id."""

from __future__ import annotations

import asyncio
import os
import shutil

SQUEUE_TIMEOUT = 30.0  # seconds; the copy is refused if squeue does not answer by then


async def running_as(job_id: str, uid: int, slurm_conf: str | None) -> str | None:
    """None if Slurm runs ``job_id`` (digits only) for ``uid``; otherwise why not."""
    if not job_id.isdigit():
        return f"job id must be a number, got {job_id!r}"
    squeue = shutil.which("squeue")
    if squeue is None:
        return "squeue is not installed on the staging daemon's host: cannot check the job"
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    # %A: the job's own id (also for an array task), %T: its state, %U: its owner's uid.
    proc = await asyncio.create_subprocess_exec(
        squeue, "-h", "-j", job_id, "-o", "%A %T %U", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), SQUEUE_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return f"Slurm did not answer in {SQUEUE_TIMEOUT:g} s; try again"
    for line in out.decode(errors="replace").splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] == job_id:
            if fields[2] != str(uid):
                return f"job {job_id} is not yours"
            if fields[1] != "RUNNING":
                return f"job {job_id} is not running ({fields[1]})"
            return None
    if proc.returncode and b"Invalid job id" not in err:
        return f"squeue failed: {err.decode(errors='replace').strip()[:200]}"
    return f"Slurm does not know job {job_id}"
