"""Runs transfers in worker processes, one per transfer, each as the job's user.

``TransferExecutor.submit`` is ``concurrent.futures``-style: it returns a Future that resolves
to ``None`` on success or raises ``TransferError``; a distributed executor with the same two
methods (``submit``, ``cancel``) can replace it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from bbstage import worker
from bbstage.identity import Identity
from bbstage.movers import Cancelled, TransferError

Event = tuple[Any, ...]
KILL_AFTER = 1.5  # seconds between SIGTERM and SIGKILL on cancel


class TransferExecutor:
    def __init__(self, max_workers: int) -> None:
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(
            [
                "__main__",
                "bbstage.worker",
                "bbstage.movers.implementations.posix",
                "bbstage.movers.implementations.s3",  # s3fs/aiobotocore: ~0.5 s to import
            ]
        )
        self._slots = threading.Semaphore(max_workers)
        self._lock = threading.Lock()
        self._running: dict[str, Any] = {}  # key -> Process
        self._cancelled: set[str] = set()
        self._submitted = 0

    @property
    def running(self) -> int:
        """Transfers running in a worker process now."""
        return len(self._running)

    @property
    def queued(self) -> int:
        """Transfers waiting for a worker slot."""
        return max(0, self._submitted - len(self._running))

    def submit(
        self,
        key: str,
        spec: dict[str, Any],
        identity: Identity,
        on_event: Callable[[Event], None],
    ) -> Future[None]:
        """Start a transfer; ``on_event`` gets the worker's plan/progress events (any thread)."""
        future: Future[None] = Future()
        with self._lock:
            self._cancelled.discard(key)
            self._submitted += 1
        future.add_done_callback(self._done)
        thread = threading.Thread(
            target=self._guarded, args=(key, spec, identity, on_event, future), daemon=True
        )
        thread.start()
        return future

    def _done(self, _future: Future[None]) -> None:
        with self._lock:
            self._submitted -= 1

    def cancel(self, key: str) -> None:
        """Stop a transfer: SIGTERM (the worker removes its partial files), SIGKILL if needed."""
        with self._lock:
            self._cancelled.add(key)
            proc = self._running.get(key)
        if proc is None or proc.pid is None:
            return
        _signal(proc.pid, signal.SIGTERM)
        proc.join(KILL_AFTER)
        if proc.is_alive():
            _signal(proc.pid, signal.SIGKILL)
            proc.join(1)

    def shutdown(self) -> None:
        with self._lock:
            keys = list(self._running)
        for key in keys:
            self.cancel(key)

    def _guarded(self, *args: Any) -> None:
        """Run a transfer; whatever happens, its future gets an outcome."""
        future: Future[None] = args[-1]
        try:
            self._run(*args)
        except Exception as exc:
            if not future.done():
                future.set_exception(TransferError(f"could not run the transfer: {exc}"))

    def _run(
        self,
        key: str,
        spec: dict[str, Any],
        identity: Identity,
        on_event: Callable[[Event], None],
        future: Future[None],
    ) -> None:
        temps: list[str] = []
        outcome: Event | None = None
        with self._slots:
            with self._lock:
                if key in self._cancelled:
                    future.set_exception(Cancelled())
                    return
                parent, child = self._ctx.Pipe(duplex=False)
                proc = self._ctx.Process(
                    target=worker.main, args=(child, spec, identity), name=f"bbstage-{key}"
                )
                proc.start()
                child.close()
                self._running[key] = proc
            try:
                while True:
                    try:
                        event = parent.recv()
                    except (EOFError, OSError):
                        break
                    if event[0] == "temp":
                        temps.append(event[1])
                    elif event[0] in ("done", "error"):
                        outcome = event
                    else:
                        on_event(event)
                proc.join()
            finally:
                parent.close()
                with self._lock:
                    self._running.pop(key, None)
                    cancelled = key in self._cancelled
        if outcome is None or outcome[0] == "error":
            # Killed, crashed or failed: make sure no partial file is left behind.
            self._cleanup(temps, identity)
        if outcome is not None and outcome[0] == "done":
            future.set_result(None)
        elif cancelled:
            future.set_exception(Cancelled())
        elif outcome is None:
            future.set_exception(
                TransferError(f"worker exited with code {proc.exitcode}", permanent=False)
            )
        else:
            future.set_exception(TransferError(outcome[1], permanent=outcome[2]))

    def _cleanup(self, temps: list[str], identity: Identity) -> None:
        leftovers = [p for p in temps if os.path.lexists(p)]
        if leftovers:
            proc = self._ctx.Process(target=worker.cleanup, args=(leftovers, identity))
            proc.start()
            proc.join(10)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
