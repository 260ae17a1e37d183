"""What the engine tells its subscribers (metrics today): typed, after the fact.

The engine records state and emits these; ``Engine.subscribe`` adds a listener. A listener
runs in the engine's event loop and must be quick; one that raises is logged and skipped,
so a broken subscriber never changes what the engine answers or records.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HookAnswered:
    """A Slurm hook's request got its reply."""

    op: str
    status: str  # ok, busy or error
    seconds: float


@dataclass(frozen=True)
class TransferEnded:
    """A directive's transfer ended for good (not a stop for shutdown or a retried attempt)."""

    direction: str  # in or out
    outcome: str  # done, failed or cancelled
    seconds: float
    bytes: int
    files: int
    uid: int | None = None  # the job's owner


EngineEvent = HookAnswered | TransferEnded
