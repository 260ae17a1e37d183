"""The shards of one transfer as one transfer (``bbstage.daemon.dask_executor`` runs each shard of a
tree as an attempt of its own): their ``Planned`` and ``Moved`` summed, their outcomes
combined into the transfer's future once every shard has ended. The first shard that fails
stops the others and fails the transfer with its own error."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from bbstage.transfer import Done, Event, Moved, Planned


class Split:
    """The shards of one transfer as one: their events summed for the engine, their
    outcomes combined into the transfer's future once every shard has ended."""

    def __init__(self, count: int, on_event: Any, future: Future[Done], stop: Any) -> None:
        self._lock = threading.Lock()
        self._on_event, self._future, self._stop = on_event, future, stop
        self._planned: list[Planned | None] = [None] * count
        self._moved: list[Moved] = [Moved(0, 0)] * count
        self._outcomes: list[Future[Done]] = []
        self._first: BaseException | None = None  # the first shard's failure, in time

    def event(self, index: int) -> Any:
        """Shard ``index``'s ``on_event``."""

        def on_event(event: Event) -> None:
            with self._lock:
                if isinstance(event, Planned):
                    self._planned[index] = event
                    known = [p for p in self._planned if p is not None]
                    final = len(known) == len(self._planned) and all(p.final for p in known)
                    total = Planned(sum(p.bytes for p in known), sum(p.files for p in known),
                                    final, sum(p.skipped for p in known))  # fmt: skip
                    self._on_event(total)
                elif isinstance(event, Moved):
                    self._moved[index] = event
                    self._on_event(Moved(sum(m.bytes for m in self._moved),
                                         sum(m.files for m in self._moved)))  # fmt: skip

        return on_event

    def outcome(self) -> Future[Done]:
        """A shard's future: the transfer resolves when all have."""
        shard: Future[Done] = Future()
        self._outcomes.append(shard)
        shard.add_done_callback(self._ended)
        return shard

    def _ended(self, shard: Future[Done]) -> None:
        error = shard.exception()
        with self._lock:
            first = error is not None and self._first is None
            if first:
                self._first = error
            ended = all(f.done() for f in self._outcomes)
        if first:
            self._stop()  # the others need not go on: the transfer is tried again
        if not ended or self._future.done():
            return
        if self._first is not None:  # not the siblings' "cancelled" it caused
            self._future.set_exception(self._first)
        else:
            dones = [f.result() for f in self._outcomes]
            self._future.set_result(Done(sum(d.bytes for d in dones), sum(d.files for d in dones)))
