"""Staging during the job, for application authors (docs/user-guide.md "During the job").

From inside a running job (``$SLURM_JOB_ID`` set), on any node that has the bbstage config
(or ``$BBSTAGE_API``) and munge::

    from bbstage import api

    ckpt = api.copy("$BB_SCRATCH/ckpt-0042/", "/project/run7/ckpt-0042/", checksum="xxh3")
    ...                       # keep computing: the daemon copies as you, in the background
    api.wait([ckpt])          # raises api.CopyFailed naming each failure's reason
    api.copy("$BB_SCRATCH/final.h5", "/project/run7/final.h5", at_end=True)  # after the job

Copies follow a ``stage_out`` directive's rules (paths, ``$BB_SCRATCH``, ``s3://``,
``checksum=``, ``overwrite=``, ``profile=``) and run as the job's user, sharing the user's
fair share with the job's other transfers. A copy is named ``"JOBID:N"``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bbstage import client, clientconfig

DONE_STATES = ("done", "failed", "cancelled")
# How long ``wait`` without a timeout rides out an unreachable daemon (a restart: its copies
# resume from its state database) before it gives up.
UNREACHABLE_GRACE = 300.0


class CopyFailed(RuntimeError):
    """Copies that ended failed (or cancelled): ``failures`` is [(id, reason)]."""

    def __init__(self, failures: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"copy {i} failed: {why}" for i, why in failures))
        self.failures = failures


class Client:
    """Calls to the staging daemon for one job (``job_id``, default ``$SLURM_JOB_ID``)."""

    def __init__(self, config_path: str | Path | None = None, job_id: str | None = None) -> None:
        path = config_path or os.environ.get("BBSTAGE_CONFIG") or clientconfig.DEFAULT_PATH
        conf = clientconfig.load_client(path)  # where the daemon listens: nothing else
        self.target = client.target(conf.user_socket, conf.api_address, conf.munge_socket)
        self._job_id = job_id or os.environ.get("SLURM_JOB_ID")

    @property
    def job_id(self) -> str:
        if not self._job_id:
            raise ValueError("no job: run inside a Slurm job ($SLURM_JOB_ID) or name the job")
        return self._job_id

    def call(self, op: str, **fields: Any) -> Any:
        return client.call(self.target, op, **fields)

    def copy(
        self,
        source: str,
        destination: str,
        *,
        checksum: str | None = None,
        overwrite: str | None = None,
        profile: str | None = None,
        at_end: bool = False,
        wait: bool = False,
    ) -> str:
        """Start a copy now (or, ``at_end``, add a stage-out that runs after the job); its id.
        ``wait``: return once it has ended (CopyFailed if it failed)."""
        options = {"checksum": checksum, "overwrite": overwrite, "profile": profile}
        fields = {k: v for k, v in options.items() if v is not None}
        result = self.call("copy", job_id=self.job_id, source=source, destination=destination,
                           at_end=at_end, **fields)  # fmt: skip
        copy_id = str(result["id"])
        if wait and not at_end:
            self.wait([copy_id])
        return copy_id

    def copies(self) -> list[dict[str, Any]]:
        """The job's copies (``bbstage status`` rows with ``kind`` copy or at_end)."""
        status = self.call("status", job_id=self.job_id)
        return [row for row in status["directives"] if row.get("kind") in ("copy", "at_end")]

    def wait(
        self, ids: Iterable[str] | None = None, timeout: float | None = None, interval: float = 0.5
    ) -> list[dict[str, Any]]:
        """Block until the given copies (all the job's copies started now, if None) have
        ended; their rows. CopyFailed names each one that failed or was cancelled;
        TimeoutError after ``timeout`` seconds. A daemon that cannot be reached (restarting)
        is asked again until the timeout, or for UNREACHABLE_GRACE seconds without one."""
        wanted = None if ids is None else {_index(i, self.job_id) for i in ids}
        deadline = None if timeout is None else time.monotonic() + timeout
        unreachable_since: float | None = None
        while True:
            try:
                rows = self.copies()
            except client.Unreachable:
                # The daemon is away (restarting): ask again until the timeout (without one,
                # for UNREACHABLE_GRACE seconds); its copies are in its state, not lost.
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now > (deadline or unreachable_since + UNREACHABLE_GRACE):
                    raise
                time.sleep(interval)
                continue
            unreachable_since = None
            mine = [r for r in rows if (r["index"] in wanted if wanted is not None
                                        else r["kind"] == "copy")]  # fmt: skip
            if wanted is not None:
                missing = wanted - {r["index"] for r in mine}
                if missing:
                    raise ValueError(f"job {self.job_id} has no copy {sorted(missing)[0]}")
                late = [r for r in mine if r["kind"] == "at_end" and r["state"] not in DONE_STATES]
                if late:
                    raise ValueError(f"copy {self.job_id}:{late[0]['index']} is --at-end: it runs"
                                     " after the job ends")  # fmt: skip
            if all(r["state"] in DONE_STATES for r in mine):
                failed = [(r["id"], r["error"] or r["state"]) for r in mine if r["state"] != "done"]
                if failed:
                    raise CopyFailed(failed)
                return mine
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"copies of job {self.job_id} still running")
            time.sleep(interval)

    def cancel(self, copy_id: str) -> str:
        """Stop a copy; its state after."""
        job_id = copy_id.partition(":")[0] if ":" in copy_id else self.job_id
        result = self.call("cancel", job_id=job_id, index=_index(copy_id, job_id))
        return str(result["state"])


def _index(copy_id: str, job_id: str) -> int:
    """N of "JOBID:N" (or of "N" for the current job)."""
    job, sep, index = str(copy_id).rpartition(":")
    if (sep and job != job_id) or not index.isdigit():
        raise ValueError(f"{copy_id!r} is not a copy of job {job_id} (JOBID:N)")
    return int(index)


_default: Client | None = None


def _client() -> Client:
    global _default
    if _default is None:
        _default = Client()
    return _default


def copy(source: str, destination: str, **options: Any) -> str:
    """``Client().copy`` for the current job ($SLURM_JOB_ID)."""
    return _client().copy(source, destination, **options)


def wait(ids: Iterable[str] | None = None, timeout: float | None = None) -> list[dict[str, Any]]:
    return _client().wait(ids, timeout)


def cancel(copy_id: str) -> str:
    return _client().cancel(copy_id)


def copies() -> list[dict[str, Any]]:
    return _client().copies()
