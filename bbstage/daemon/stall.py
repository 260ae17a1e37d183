"""The stall watchdog's parts both executors share (docs/operations.md "Fair share").

A transfer whose copy sends no event (no byte moved, no file planned) for ``stall_timeout``
seconds is stopped as a cancel would stop it, its temporary files removed, and it fails
transiently with ``reason``. The local executor waits on each worker's pipe with that
timeout (``bbstage.daemon.executor``); the Dask executor's attempts are watched by a ``Watchdog``
thread, which hears of each event they send back and stops one that falls silent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from bbstage.movers.localfs import temp_owner
from bbstage.transfer import TransferSpec


def reason(spec: TransferSpec, temps: set[str], seconds: float) -> str:
    """Why a stalled transfer was stopped, naming where it was stuck: the files it was
    writing (their temporary files' destinations), else its source."""
    writing = sorted({temp_owner(t) for t in temps})
    if not spec.tree or not writing:
        where = f"{spec.source} -> {spec.destination}"
    else:
        more = f" and {len(writing) - 3} more" if len(writing) > 3 else ""
        where = ", ".join(writing[:3]) + more
    return said(where, seconds)


def said(where: str, seconds: float) -> str:
    """The reason for a transfer stopped while copying ``where``."""
    return f"stalled: nothing moved for {seconds:g} s (stall_timeout) while copying {where}"


class Watched(Protocol):
    """What the watchdog reads of an attempt: when it was last heard of (``time.monotonic``;
    None until it runs), and whether it ended or was already stopped."""

    heard: float | None
    finished: bool
    stalled: str


class Watchdog:
    """Every ``timeout / 4`` s (at most 1 s), hand each running attempt not heard of for
    ``timeout`` s to ``stop`` (once: ``stop`` sets its ``stalled``)."""

    def __init__(
        self,
        timeout: float,
        running: Callable[[], Iterable[Watched]],
        stop: Callable[[Watched], None],
    ) -> None:
        self.timeout = timeout
        self._running, self._stop = running, stop
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start watching (again: idempotent)."""
        with self._lock:
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(
                    target=self._watch, name="bbstage-dask-stalls", daemon=True
                )
                self._thread.start()

    def close(self) -> None:
        self._closed.set()

    def _watch(self) -> None:
        every = min(1.0, self.timeout / 4)
        while not self._closed.wait(every):
            now = time.monotonic()
            for attempt in list(self._running()):
                heard = attempt.heard
                if heard is None or attempt.finished or attempt.stalled:
                    continue
                if now - heard >= self.timeout:
                    self._stop(attempt)
