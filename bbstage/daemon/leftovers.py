"""Remove a job's temporary files when the daemon has no record of the job.

A worker's named temporary files (``.NAME.bbstage-JOB-GROUP.part``, ``localfs.temp_name``)
are removed by the worker, by the executor when a worker is killed, or by the job's next
attempt. A daemon killed right after a worker, whose state is then lost, knows none of
them: the job's teardown finds them from its script instead. Each directory a local
destination of the script names is read (as root: only names and owners), and each file
that bears this job's temporary name is removed by a process running as that file's owner,
so nothing is removed that its owner could not remove; and only the job owner's files
(``whose``: the hooks of 24.05+ send the uid; Slurm 22.05's carry none, and then only a sole
owner's files are removed). A job is swept at most once every ``SWEEP_EVERY`` s (``Pace``).
"""

from __future__ import annotations

import math
import os
import pwd
import stat
import subprocess
import time
from collections.abc import Iterator

import structlog

from bbstage import directives
from bbstage.identity import Identity, IdentityError, unlink_as
from bbstage.movers import Registry, localfs

log = structlog.get_logger(__name__)

LIMIT = 200_000  # directory entries read per teardown at most (a destination tree is big)
SWEEP_EVERY = 30.0  # seconds between two sweeps of one job at least


def places(script: str, registry: Registry) -> list[tuple[str, bool]]:
    """The local directories a job's temporary files may be in: (directory, whole tree?)
    for each destination outside scratch of ``script``'s directives (stage-in and
    stage-out alike); none for a script that does not parse (by ``registry``'s rules: the
    site's)."""
    parsed = directives.parse(script, registry)
    found: dict[str, bool] = {}
    for d in parsed["directives"]:
        if d["destination_kind"] != "posix":
            continue
        dest = d["destination"]
        if d["tree"] or d["glob"] or dest.endswith("/"):
            found[dest] = True
        else:
            parent = os.path.dirname(dest)
            found[parent] = found.get(parent, False)
    return list(found.items())


def find(where: list[tuple[str, bool]], job_id: str, limit: int = LIMIT) -> dict[int, list[str]]:
    """This job's temporary files in ``where``, by owner uid; at most ``limit`` entries
    read. Symbolic links are neither followed nor taken."""
    pattern, by_owner, seen = localfs.temp_pattern(job_id), {}, 0
    for top, tree in where:
        for path in _entries(top, tree):
            seen += 1
            if seen > limit:
                log.warning("leftover search stopped", job_id=job_id, entries=limit)
                return by_owner
            if not pattern.match(os.path.basename(path)):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                by_owner.setdefault(st.st_uid, []).append(path)
    return by_owner


def _entries(top: str, tree: bool) -> Iterator[str]:
    """The paths in directory ``top`` (and below it, for a ``tree``); none if unreadable."""
    stack = [top]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    yield entry.path
                    if tree and entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue


def remove(by_owner: dict[int, list[str]], job_id: str) -> int:
    """Remove each owner's files as that owner (never as root); how many were removed."""
    removed = 0
    for uid, paths in by_owner.items():
        try:
            identity = Identity.of(uid, pwd.getpwuid(uid).pw_gid)
        except (KeyError, IdentityError) as exc:
            log.warning("leftovers kept", job_id=job_id, uid=uid, files=len(paths),
                        reason=str(exc) or "unknown uid")  # fmt: skip
            continue
        try:
            unlink_as(identity, paths)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("leftovers kept", job_id=job_id, uid=uid, files=len(paths),
                        reason=str(exc))  # fmt: skip
            continue
        removed += sum(not os.path.lexists(p) for p in paths)
    return removed


def read(script_path: str, job_id: str) -> str | None:
    """The job script Slurm keeps at ``script_path`` (bytes as surrogate escapes, as the
    hooks send them), or None if it cannot be read (Slurm may have removed it)."""
    try:
        with open(script_path, "rb") as f:
            return f.read().decode("utf-8", "surrogateescape")
    except OSError as exc:
        log.info("no script to look for leftovers in", job_id=job_id, error=str(exc))
        return None


def whose(by_owner: dict[int, list[str]], job_id: str, uid: int | None) -> dict[int, list[str]]:
    """The files of ``by_owner`` to remove: the job owner's (``uid``, which 24.05+ hooks
    send) only; without it (Slurm 22.05), those of a sole owner. Anything else is kept and
    logged: a file of another owner that bears this job id is not this job's (another
    cluster's job of that id on a shared file system, or an id reused)."""
    if uid is not None:
        mine = {u: p for u, p in by_owner.items() if u == uid}
    elif len(by_owner) == 1:
        mine = dict(by_owner)
    else:
        mine = {}
    for owner, paths in by_owner.items():
        if owner not in mine:
            log.warning("leftovers of another owner kept", job_id=job_id, uid=owner,
                        job_uid=uid, files=len(paths))  # fmt: skip
    return mine


class Pace:
    """At most one sweep per job every ``every`` seconds: Slurm polls test_data_in of a job
    every few seconds, and each sweep reads up to ``LIMIT`` entries, as root, in directories
    the user's script names."""

    def __init__(self, every: float = SWEEP_EVERY) -> None:
        self.every = every
        self._last: dict[str, float] = {}

    def due(self, job_id: str) -> bool:
        """Whether ``job_id`` may be swept now (and if so, the sweep is counted from now)."""
        now = time.monotonic()
        if now - self._last.get(job_id, -math.inf) < self.every:
            return False
        if len(self._last) >= 4096:  # forget the jobs not swept lately
            self._last = {j: t for j, t in self._last.items() if now - t < self.every}
        self._last[job_id] = now
        return True


def sweep(script: str, job_id: str, registry: Registry, uid: int | None = None) -> int:
    """Find and remove the temporary files job ``job_id`` (of ``uid``, if known) left in the
    local destinations its ``script`` names; how many were removed."""
    removed = remove(whose(find(places(script, registry), job_id), job_id, uid), job_id)
    if removed:
        log.warning("temporary files of a job unknown to the daemon removed", job_id=job_id,
                    files=removed)  # fmt: skip
    return removed
