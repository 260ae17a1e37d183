"""Draining before an upgrade (``bbstage drain``): start nothing new, let what runs finish
until a deadline, then stop as on SIGTERM (what is still running resumes on the next start).

A drained daemon leaves ``MARK`` in the directory of stage-in verdicts (``staged.py``: the
hooks read it, the next daemon's start empties it): a hook that finds no daemon, in the gap
before the next one starts, then asks again instead of failing at once.

While it drains the daemon answers "not now, ask again" (``again``) to what would start new
work: a job's setup, a stage-in or stage-out not yet started, an in-job copy. The hooks ask
again until their own timeout (lua/bbstage/hooks.lua), so the next daemon answers them. It
still answers what starts nothing: the polls (``test_data_*``), a stage-in or stage-out
already running (22.05's blocking ``data_in`` keeps waiting), ``paths``, ``pre_run``,
``post_run``, teardown, status. The same answer serves a daemon that is not the leader.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bbstage.daemon.state import JobState

WHY = "the staging daemon is draining for an upgrade"
MARK = ".drained"  # in the staged directory, which the next daemon's start empties
# The job states from which data_in / data_out start nothing new.
_STARTED = {
    "data_in": {s for s in JobState if s != JobState.SETUP},
    "data_out": {
        JobState.STAGING_OUT,
        JobState.STAGED_OUT,
        JobState.DONE,
        JobState.FAILED,
        JobState.CANCELLED,
    },  # fmt: skip
}
_NEW_WORK = {"setup", "copy"}


def answers(op: str, state: JobState | None) -> bool:
    """Whether a draining daemon answers ``op`` for a job in ``state`` (None: unknown)."""
    if op in _NEW_WORK:
        return False
    if op in _STARTED:
        return state in _STARTED[op]
    return True


async def until_idle(busy: Callable[[], bool], deadline: float, stop: Callable[[], None]) -> None:
    """Call ``stop`` once nothing is ``busy`` or at ``deadline`` (monotonic), whichever is
    first."""
    while busy() and time.monotonic() < deadline:
        await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    stop()
