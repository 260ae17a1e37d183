"""Runs transfers in worker processes, each as the job's user.

A ``bbstage.daemon.contracts.Executor``, as ``bbstage.daemon.dask_executor.DaskExecutor`` (transfer
nodes) is: the engine holds one or the other.

A worker process drops to one user's uid, gid and groups for good, then runs that user's
transfers one at a time. After a transfer it waits, idle, for the next one of the same
identity (a fresh process costs more than a small transfer: docs/performance.md): a job
array's tasks reuse it. Its events come back through ``bbstage.transfer.codec`` (typed JSON frames,
bounded): a worker runs as the user, so root never unpickles what it sends. It is retired
after ``IDLE_RETIRE`` seconds idle (and exits by itself if the daemon goes away). A failed
or cancelled transfer ends its worker.

Transfers wait in per-user queues; ``bbstage.daemon.fairshare`` says which runs next (the executor
only runs what it picks). A transfer that sends no event (no byte moved, no file planned)
for ``stall_timeout`` seconds is stopped as its cancel would be (SIGTERM, then SIGKILL),
its temporary files removed, and it fails transiently with a reason naming where it was.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

import structlog

from bbstage import movers
from bbstage.daemon import cgroups, fairshare, metrics, stall
from bbstage.daemon.contracts import Sink
from bbstage.identity import Identity, unlink_as
from bbstage.movers import Cancelled, TransferError
from bbstage.transfer import Done, Failed, TransferSpec, codec, track_temps, worker

KILL_AFTER = 1.5  # seconds between SIGTERM and SIGKILL on cancel
IDLE_RETIRE = 10.0  # seconds an idle worker is kept for its user's next transfer
STALL_TIMEOUT = 300.0  # seconds without any event from a worker before it is stopped

log = structlog.get_logger(__name__)


@dataclass
class _Worker:
    """A worker process and the parent's end of its pipe."""

    proc: Any  # multiprocessing Process
    conn: Any  # multiprocessing Connection (duplex)
    identity: Identity
    idle_since: float = field(default_factory=time.monotonic)

    def ask_to_exit(self) -> None:
        """Tell it to exit (it has no transfer)."""
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.conn.close()

    def retire(self) -> None:
        """Ask it to exit and reap it."""
        self.ask_to_exit()
        _reap([self.proc])


_Item = tuple[TransferSpec, Identity, Sink, "Future[Done]"]


class TransferExecutor(fairshare.Queued):
    def __init__(
        self,
        max_workers: int,
        policy: str = fairshare.FAIR,
        weights: dict[int, float] | None = None,
        stall_timeout: float = STALL_TIMEOUT,
        cgroup: tuple[Path, ...] = (),
        registry: movers.Registry | None = None,
    ) -> None:
        """``registry``: the site's backends (``config.registry``; by default posix and s3),
        whose modules the forkserver imports once."""
        registry = registry or movers.Registry.default()
        self._cgroup = cgroup  # each worker goes there before its first transfer
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(
            [
                # Python 3.11's forkserver never preloads __main__ (it looks for the key
                # "main_path", the preparation data calls it "init_main_from_path"), so
                # each worker re-runs the main script's top level: the daemon's console
                # script, a few ms. A program with heavy top-level imports makes every
                # fresh worker pay for them (benchmarks/bench_s3.py keeps its light).
                "__main__",
                "bbstage.transfer.worker",
                *registry.preloads(),  # the enabled backends' (S3: ~0.3 s per worker saved)
                # Else read from disk by each worker (its start, its first connection)
                "pkgutil",
                "multiprocessing.popen_forkserver",
                "encodings.idna",
            ]
        )
        forkserver.ensure_running()  # now, not in the middle of the first job's setup
        self._max_workers = max_workers
        self._stall_timeout = stall_timeout
        # Transfers wait here, in their user's queue, until the policy starts them.
        self._queue: fairshare.Queue[_Item] = fairshare.Queue(
            fairshare.Policy(max_workers, weights, policy), self._launch
        )
        # One thread per running transfer, kept for the next: a new thread costs the event
        # loop a wait in submit. Never more than the policy runs at once, so none waits here.
        self._threads = ThreadPoolExecutor(self._queue.policy.cap, thread_name_prefix="transfer")
        self._closing = False
        self._lock = threading.Lock()
        self._running: dict[str, _Worker] = {}
        self._idle: list[_Worker] = []
        self._cancelled: set[str] = set()
        self._reaper: threading.Thread | None = None

    @property
    def running(self) -> int:
        """Transfers running in a worker process now."""
        return len(self._running)

    @property
    def idle(self) -> int:
        """Worker processes waiting for their user's next transfer."""
        return len(self._idle)

    def submit(
        self,
        key: str,
        spec: TransferSpec,
        identity: Identity,
        on_event: Sink,
        order: tuple[Any, ...] = (),
    ) -> Future[Done]:
        """Queue a transfer in its user's queue (``order``: smaller first within the user's,
        then arrival); ``on_event`` gets the worker's ``Planned`` and ``Moved`` events (in
        an executor thread)."""
        future: Future[Done] = Future()
        with self._lock:
            self._cancelled.discard(key)
        self._queue.add(key, identity.uid, order, (spec, identity, on_event, future))
        return future

    def _launch(self, key: str, item: _Item) -> None:
        """The policy picked this transfer: run it in a thread of its own."""
        self._threads.submit(self._guarded, key, *item)

    def abandon(self, attempts: list[str]) -> None:
        """Attempts a stopped daemon left running: nothing to do here, its workers ended
        with it (they exit when the daemon goes away)."""

    def cancel(self, key: str) -> None:
        """Stop a transfer: SIGTERM (the worker removes its partial files), SIGKILL if needed;
        one still queued just leaves its queue."""
        waiting = self._queue.withdraw(key)
        if waiting is not None:
            waiting[-1].set_exception(Cancelled())
            return
        self._stop([key])

    def shutdown(self) -> None:
        """Cancel the running transfers and end the idle workers, all at once: a shutdown
        takes at most ``KILL_AFTER`` (plus a second) whatever the number of workers."""
        with self._lock:
            self._closing = True  # queued transfers end as cancelled
            keys = list(self._running)
            idle, self._idle = self._idle, []
        for item in self._queue.drain():
            item[-1].set_exception(Cancelled())
        for each in idle:
            each.ask_to_exit()
        self._stop(keys)
        _reap([w.proc for w in idle])
        self._threads.shutdown(wait=False)

    def _stop(self, keys: list[str]) -> None:
        """SIGTERM the workers of these transfers together; SIGKILL those still alive after
        ``KILL_AFTER``."""
        with self._lock:
            self._cancelled.update(keys)
            procs = [self._running[k].proc for k in keys if k in self._running]
        procs = [p for p in procs if p.pid is not None]
        for proc in procs:
            _signal(proc.pid, signal.SIGTERM)
        _reap(procs)

    def _guarded(
        self,
        key: str,
        spec: TransferSpec,
        identity: Identity,
        on_event: Sink,
        future: Future[Done],
    ) -> None:
        """Run a transfer; whatever happens, its slot is freed, then its future gets an
        outcome (in this order: the engine may submit it again at once)."""
        result: Done | None = None
        error: BaseException | None = None
        try:
            result = self._run(key, spec, identity, on_event)
        except (Cancelled, TransferError) as exc:
            error = exc
        except Exception as exc:
            error = TransferError(f"could not run the transfer: {exc}")
        finally:
            self._queue.release(key)
        if result is not None:
            future.set_result(result)
        else:
            future.set_exception(error or TransferError("the transfer ended with no outcome"))

    def _run(
        self,
        key: str,
        spec: TransferSpec,
        identity: Identity,
        on_event: Sink,
    ) -> Done:
        """The transfer's manifest; raises ``Cancelled`` or ``TransferError``."""
        # The worker's named temporary files not yet renamed or removed: bounded by the files
        # in flight (the worker tells which it settled), not by the files of the transfer.
        temps: set[str] = set()
        outcome: Done | Failed | None = None
        stalled = ""
        current = self._acquire(key, identity)
        if current is None:
            raise Cancelled()
        try:
            current.conn.send(spec)  # root -> user: a pickle from root is no risk
            last = time.monotonic()  # the worker's last event: it still moves
            while outcome is None:
                if not current.conn.poll(max(0.0, last + self._stall_timeout - time.monotonic())):
                    stalled = stall.reason(spec, temps, self._stall_timeout)
                    metrics.STALLS.inc()
                    _signal(current.proc.pid, signal.SIGTERM)  # as a cancel: SIGKILL after
                    _reap([current.proc])
                    break
                try:
                    event = codec.receive(current.conn)  # user -> root: never a pickle
                except codec.CodecError as exc:
                    outcome = Failed(f"the worker sent a malformed event, refused: {exc}")
                    break
                last = time.monotonic()
                if isinstance(event, Done | Failed):
                    outcome = event
                elif not track_temps(temps, event):
                    on_event(event)
        except (EOFError, OSError):
            pass  # the worker died (killed on cancel, or crashed)
        finally:
            with self._lock:
                self._running.pop(key, None)
                cancelled = key in self._cancelled
                reuse = isinstance(outcome, Done) and not cancelled
                if reuse:
                    current.idle_since = time.monotonic()
                    self._idle.append(current)
                    stale = self._stale()
                    self._start_reaper()
                else:
                    stale = [current]
        for each in stale:
            each.retire()
        if not isinstance(outcome, Done):
            # Killed, stalled, crashed or failed: make sure no partial file is left behind.
            self._cleanup(temps, identity)
        if isinstance(outcome, Done):
            return outcome
        if cancelled:
            raise Cancelled()
        if stalled:
            raise TransferError(stalled, permanent=False)
        if outcome is None:  # retired above: its exit code is known
            raise TransferError(f"worker exited with code {current.proc.exitcode}", permanent=False)
        raise TransferError(outcome.message, permanent=outcome.permanent)

    def _acquire(self, key: str, identity: Identity) -> _Worker | None:
        """A worker for this transfer, registered as running; None if it was cancelled
        first. A new process starts outside the lock: that takes milliseconds, and
        ``submit`` (on the daemon's event loop) must not wait for it."""
        with self._lock:
            if key in self._cancelled or self._closing:
                return None
            found = self._take(identity)
        if found is None:
            found = self._spawn(identity)
        with self._lock:
            if key not in self._cancelled:
                self._running[key] = found
                return found
        found.retire()
        return None

    def _take(self, identity: Identity) -> _Worker | None:
        """An idle worker of this identity, if there is one (call with the lock held)."""
        for i in range(len(self._idle) - 1, -1, -1):
            each = self._idle[i]
            if each.identity == identity and each.proc.is_alive():
                del self._idle[i]
                return each
        return None

    def _spawn(self, identity: Identity) -> _Worker:
        """A new worker process for this identity."""
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=worker.serve,
            args=(child, identity, os.getpid()),
            name=f"bbstage-worker-{identity.uid}",
        )
        proc.start()
        child.close()
        found = _Worker(proc, parent, identity)
        try:
            cgroups.enter(self._cgroup, proc.pid)
        except cgroups.CgroupError as exc:  # never a worker without its bounds
            found.retire()
            raise TransferError(f"worker not started: {exc}", permanent=False) from None
        return found

    def _stale(self) -> list[_Worker]:
        """Take out the idle workers to retire: too old, or beyond ``max_workers`` of them
        (call with the lock held)."""
        now = time.monotonic()
        keep = [w for w in self._idle if now - w.idle_since < IDLE_RETIRE]
        stale = [w for w in self._idle if w not in keep]
        if len(keep) > self._max_workers:
            stale += keep[: len(keep) - self._max_workers]
            keep = keep[len(keep) - self._max_workers :]
        self._idle = keep
        return stale

    def _start_reaper(self) -> None:
        """Retire idle workers as they age, while there are any (call with the lock held)."""
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap, name="reaper", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        done = False
        while not done:
            time.sleep(1.0)
            with self._lock:
                stale = self._stale()
                if not self._idle:
                    self._reaper, done = None, True
            for each in stale:
                each.retire()

    def _cleanup(self, temps: set[str], identity: Identity) -> None:
        leftovers = [p for p in temps if os.path.lexists(p)]
        try:
            unlink_as(identity, leftovers, timeout=10)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("temporary files kept", files=len(leftovers), error=str(exc))


def _reap(procs: list[Any]) -> None:
    """Wait for these processes together, up to ``KILL_AFTER``; SIGKILL the rest."""
    deadline = time.monotonic() + KILL_AFTER
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for proc in alive:
        _signal(proc.pid, signal.SIGKILL)
    for proc in alive:
        proc.join(1)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
