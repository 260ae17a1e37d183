"""The contracts between the engine and the parts it drives, as ``Protocol``s: what any
implementation must do, written once, each with its own documentation (after structlog's
``typing.py``). An implementation does not inherit from these; a type checker (and, for
``Executor``, ``isinstance``: it is ``runtime_checkable``) says whether it fulfils one."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeAlias, runtime_checkable

from bbstage.identity import Identity
from bbstage.transfer import AttemptUpdate, Done, Event, TransferSpec

Sink: TypeAlias = Callable[[Event | AttemptUpdate], None]
"""Where an executor sends a transfer's events, in one of its own threads (never the
engine's event loop): the worker's ``Planned`` and ``Moved``, and (an executor that runs
attempts on other nodes) an ``AttemptUpdate`` for each attempt, the first before the attempt
is started. Nothing of a transfer is sent after its future has resolved."""


@runtime_checkable
class Executor(Protocol):
    """Runs the engine's transfers, each as the job's user; the engine holds one.

    A transfer is named by its ``key`` ("job id:directive index"), unique among those
    running. Every method is called from a thread that may block (``submit`` excepted: the
    event loop calls it, so it only queues). The executor keeps nothing durable: what must
    survive a restart is the engine's (``bbstage.daemon.state``)."""

    def submit(
        self,
        key: str,
        spec: TransferSpec,
        identity: Identity,
        on_event: Sink,
        order: tuple[Any, ...] = (),
    ) -> Future[Done]:
        """Queue the transfer ``spec`` in ``identity``'s queue (``order``: smaller first
        within it, then arrival) and return at once.

        Returns:
            A future: the worker's ``Done`` manifest, or ``Cancelled`` (``cancel``,
            ``shutdown``) or ``TransferError`` (``permanent`` says whether a new try could
            do better). Its slot is free again before it resolves: the engine may submit
            the key again from its callback.
        """
        ...

    def cancel(self, key: str) -> None:
        """Stop the transfer ``key`` and return once it is stopped (its partial files
        removed); a transfer not yet started just leaves its queue. Its future then raises
        ``Cancelled``."""
        ...

    def abandon(self, attempts: list[str]) -> None:
        """The ids of attempts a stopped daemon left running (``lost`` in the state): stop
        whatever of them may still run elsewhere. Does not wait."""
        ...

    def hold(self) -> None:
        """Start no more transfers; queued ones wait (they start after the next daemon's
        start, as the state has them)."""
        ...

    def shutdown(self) -> None:
        """Cancel every transfer (queued ones too) for the daemon's stop, within seconds."""
        ...

    @property
    def running(self) -> int:
        """Transfers running now (for the metrics)."""
        ...

    @property
    def queued(self) -> int:
        """Transfers waiting in their user's queue (for the metrics)."""
        ...

    def why(self, key: str) -> str | None:
        """Why transfer ``key`` waits (for ``bbstage status``), or None if it does not."""
        ...

    def users(self) -> dict[int, tuple[int, int]]:
        """Each uid with transfers here: (queued, running)."""
        ...
