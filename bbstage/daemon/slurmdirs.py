"""Mend what Slurm forgets for a task split off a burst-buffer job array.

Slurm (23.02 to at least 26.05) keeps a job array's script once, in
``<StateSaveLocation>/hash.<A % 10>/job.<A>/script`` of the array's job id A. A task that
is split off with its own job id T is still given ``hash.<T % 10>/job.<T>/script`` by the
burst-buffer hooks, a file nobody made (Slurm means to hard-link it, but links it only for
tasks split before validation), and ``bb_p_job_begin`` writes the ``paths`` file, which
carries ``$BB_SCRATCH`` into the job's environment, into that directory even when it does
not exist: the paths hook fails and Slurm holds the task (``JobHeldAdmin``) without a word
to the user. So at setup, where 24.05+ tell the hooks the array's id, the daemon makes
the directory (mode 0700, owned like the array's) and links the array's script into it,
as Slurm itself does for the tasks it links; Slurm removes both with the task's files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import structlog

log = structlog.get_logger(__name__)

_SCRIPT = re.compile(r"(?P<state>/.+)/hash\.\d/job\.\d+/script")


def mend_task(job_id: str, array_id: str, script_path: str | None, slurm_conf: str | None) -> bool:
    """Give array task ``job_id`` of array ``array_id`` its state directory and script;
    True if something was made. Failures are logged, never raised: the job may still run."""
    if not (job_id.isdigit() and array_id.isdigit()) or job_id == array_id:
        return False
    shaped = _SCRIPT.fullmatch(script_path or "")
    state = shaped["state"] if shaped else state_save_location(slurm_conf)
    if state is None:
        return False
    array_dir = os.path.join(state, f"hash.{int(array_id) % 10}", f"job.{array_id}")
    task_dir = os.path.join(state, f"hash.{int(job_id) % 10}", f"job.{job_id}")
    made = False
    try:
        owner = os.stat(array_dir)
        if not os.path.isdir(task_dir):
            os.mkdir(task_dir, 0o700)
            os.chown(task_dir, owner.st_uid, owner.st_gid)
            made = True
        if not os.path.lexists(os.path.join(task_dir, "script")):
            os.link(os.path.join(array_dir, "script"), os.path.join(task_dir, "script"))
            made = True
    except OSError as exc:  # e.g. the daemon does not run where slurmctld keeps its state
        log.warning("cannot mend the array task's Slurm directory", job_id=job_id,
                    array_job_id=array_id, path=task_dir, error=str(exc))  # fmt: skip
    return made


_known: dict[str | None, str] = {}


def state_save_location(slurm_conf: str | None) -> str | None:
    """slurmctld's StateSaveLocation, asked of ``scontrol show config`` until it answers."""
    if slurm_conf in _known:
        return _known[slurm_conf]
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    env = dict(os.environ, **({"SLURM_CONF": slurm_conf} if slurm_conf else {}))
    try:
        out = subprocess.run(
            [scontrol, "show", "config"], env=env, capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"^StateSaveLocation\s*=\s*(\S+)", out, re.MULTILINE)
    if found:
        _known[slurm_conf] = found[1]
    return found[1] if found else None
