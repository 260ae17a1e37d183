"""Runs transfers as tasks on a Dask distributed cluster of data-transfer nodes.

A ``bbstage.daemon.executor.Executor``, as the local ``TransferExecutor`` is: the daemon stays the
source of truth, Dask is a disposable executor. Each submitted transfer is one attempt (an
id in the log and in the task's key) that runs ``bbstage.transfer.dask_task.run_attempt`` on a
worker with one unit of the configured resource; there the copy runs in a child process as the
job's user. Progress comes back on the attempt's ``log_event`` topic; the outcome is the
task's result, and its ``Planned`` is handed to ``on_event`` before the future resolves, so
the engine's check "the manifest covers the plan" always has this attempt's plan, and
nothing of the attempt reaches ``on_event`` after it.

Dask does not stop a running task, so ``cancel`` sets the attempt's ``distributed.Event``
(the task polls it and kills the copy's process group) and waits for the task to end.
A tree is split into shards (``TreeShard``: the files whose destination hashes to it), one
attempt each, as many as there are workers with the resource (or ``[movers] shards``), so
its files move through every node at once; the attempts' events are summed into the
transfer's (``bbstage.daemon.split.Split``), and the transfer is done when every shard is. A failed
shard stops its siblings; the transfer fails with its error (the engine tries again, resumed).

Each attempt is told to ``on_event`` as an ``AttemptUpdate``: ``running`` before it is
submitted (the engine records it then: a failure to record it fails the attempt unsubmitted),
with its node and progress as its events come, and once with its end. Once an attempt's
outcome is final here its two ``distributed.Event`` (cancel, started) are deleted on the
scheduler, not before: a rerun of its task (a worker died) must still find ``started`` set.
Nothing is sent through a client that is not connected; one that stays disconnected is given
up and its attempts fail transiently (``bbstage.daemon.dask_client``).

Transfers wait in per-user queues (``bbstage.daemon.fairshare``, the local executor's policy):
at most ``max_workers`` transfers (a user with none running: up to twice that) are handed
to Dask at once, picked fairly; the rest wait here, not in Dask's queue.

An attempt that sends no event for ``stall_timeout`` s once its task has started on a node
(``bbstage.daemon.stall.Watchdog``) is stopped as a cancel stops it and fails transiently, naming
the path it was stuck on.

``distributed`` is imported only here, only when ``[movers] executor = "dask"``.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import structlog

from bbstage import movers as backends
from bbstage.config import Movers
from bbstage.daemon import dask_client, fairshare, metrics, stall
from bbstage.daemon.contracts import Sink
from bbstage.daemon.dask_client import Connection, connected
from bbstage.daemon.split import Split
from bbstage.daemon.state import AttemptState
from bbstage.identity import Identity
from bbstage.movers import Cancelled, TransferError
from bbstage.transfer import (
    AttemptUpdate,
    Done,
    Failed,
    FileRange,
    Moved,
    Planned,
    TransferSpec,
    TreeShard,
    codec,
    dask_task,
    planning,
)

log = structlog.get_logger("bbstage.dask")

CANCEL_WAIT = 5.0  # seconds cancel waits for the remote copy to be stopped


@dataclass
class _Attempt:
    key: str
    id: str
    on_event: Any  # Planned and Moved (a shard's: summed by Split)
    future: Future[Done]
    tell: Sink  # the transfer's on_event: this attempt's AttemptUpdate
    shard: TreeShard | FileRange = TreeShard(0, 1)
    client: Any = None  # the distributed.Client it was submitted through
    dask: Any = None  # distributed.Future, once submitted
    cancel: Any = None  # distributed.Event
    node: str = ""
    moved: Moved = Moved(0, 0)
    finished: bool = False
    where: str = ""  # SOURCE -> DESTINATION, for a stall's reason
    heard: float | None = None  # time.monotonic() of its last event (the stall watchdog's)
    stalled: str = ""  # why the watchdog stopped it
    # Orders a cancel's set of the Dask event against its deletion (no set after it).
    events: threading.Lock = field(default_factory=threading.Lock)
    released: bool = False

    def update(self, state: AttemptState = AttemptState.RUNNING, error: str = "") -> AttemptUpdate:
        """The attempt as the engine is told it."""
        moved, shard = self.moved, self.shard
        return AttemptUpdate(
            self.id, shard.index, shard.count, state, self.node, moved.bytes, moved.files, error
        )


class DaskExecutor(fairshare.Queued):
    def __init__(
        self,
        movers: Movers,
        max_workers: int = 4,
        client: Any = None,
        policy: str = fairshare.FAIR,
        weights: dict[int, float] | None = None,
        stall_timeout: float = 300.0,
    ) -> None:
        """``client``: an existing ``distributed.Client``, which stays the caller's (never
        closed here, but given up if it stays disconnected); else one is made, with the
        configured certificates, at the first ``submit``."""
        self._movers = movers
        self._lock = threading.Lock()
        self._connection = Connection(movers, client, self._in_use, self._give_up)
        self._attempts: dict[str, list[_Attempt]] = {}  # transfer key → its running attempts
        self._cancelled: set[str] = set()
        self._closing = False
        # An attempt that sends no event for stall_timeout s is stopped and fails transiently.
        self._watchdog = stall.Watchdog(stall_timeout, self._watched, self._stalled)  # type: ignore[arg-type]
        # Transfers wait here, in their user's queue, until the policy hands them to Dask.
        self._queue: fairshare.Queue[tuple[Any, ...]] = fairshare.Queue(
            fairshare.Policy(max_workers, weights, policy), self._launch
        )
        # Connecting and waiting on results block: never on the daemon's event loop.
        self._threads = ThreadPoolExecutor(max(4, max_workers), thread_name_prefix="dask")

    @property
    def running(self) -> int:
        """Transfers submitted and not finished."""
        return len(self._attempts)

    @property
    def idle(self) -> int:
        return 0

    def submit(
        self,
        key: str,
        spec: TransferSpec,
        identity: Identity,
        on_event: Sink,
        order: tuple[Any, ...] = (),
    ) -> Future[Done]:
        """Queue a transfer in its user's queue; once picked it starts on the cluster.
        ``on_event`` gets ``Planned`` and ``Moved``, and an ``AttemptUpdate`` for each
        attempt (the first before it is submitted)."""
        future: Future[Done] = Future()
        with self._lock:
            self._cancelled.discard(key)
        self._queue.add(key, identity.uid, order, (spec, identity, on_event, future))
        return future

    def _launch(self, key: str, item: tuple[Any, ...]) -> None:
        """The policy picked this transfer: hand it to Dask. Its slot is freed before its
        outcome is told (the engine may submit it again at once)."""
        spec, identity, on_event, future = item
        inner: Future[Done] = Future()

        def finish(done: Future[Done]) -> None:
            self._queue.release(key)
            error = done.exception()
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(done.result())

        inner.add_done_callback(finish)
        with self._lock:
            self._attempts[key] = []
        self._threads.submit(self._guarded, key, spec, identity, on_event, inner)

    def abandon(self, attempts: list[str]) -> None:
        """Attempts a killed daemon left running (``lost`` in the state). Their tasks stop
        their copies once the scheduler releases them (the daemon's client went away); set
        their cancel events too, for a scheduler that has not noticed yet, and ``CANCEL_WAIT``
        later delete those and the ``started`` ones, which nobody else would ever delete.
        In the background: the daemon starts without waiting for the scheduler."""
        if attempts:
            self._threads.submit(self._abandon, list(attempts))

    def _abandon(self, attempts: list[str]) -> None:
        from distributed import Event as DaskEvent

        try:
            client = self._connection.client()
            for attempt in attempts:
                DaskEvent(dask_task.cancel_event(attempt), client=client).set()
            time.sleep(CANCEL_WAIT)
            for attempt in attempts:
                for name in dask_task.events(attempt):
                    DaskEvent(name, client=client).clear()
        except Exception as exc:
            log.warning("could not stop the attempts of the daemon's last run",
                        attempts=len(attempts), error=str(exc))  # fmt: skip
            return
        log.info("attempts of the daemon's last run stopped", attempts=len(attempts))

    def cancel(self, key: str) -> None:
        """Stop a transfer: its tasks kill the remote copies; wait until they did. One still
        queued just leaves its queue."""
        waiting = self._queue.withdraw(key)
        if waiting is not None:
            waiting[-1].set_exception(Cancelled())
            return
        for attempt in self._signal(key):
            self._wait(attempt, CANCEL_WAIT)

    def shutdown(self) -> None:
        """Cancel every running attempt (they resume on the next start) and disconnect."""
        with self._lock:
            self._closing = True
            keys = list(self._attempts)
        self._watchdog.close()
        for item in self._queue.drain():
            item[-1].set_exception(Cancelled())
        attempts = [a for key in keys for a in self._signal(key)]
        for attempt in attempts:
            self._wait(attempt, CANCEL_WAIT / len(attempts))
        self._threads.shutdown(wait=False)
        self._connection.close()

    def _signal(self, key: str, cancelled: bool = True) -> list[_Attempt]:
        """Set the events of ``key``'s attempts; the attempts that run. ``cancelled``: mark
        the transfer cancelled too (not when a failed shard stops its siblings)."""
        with self._lock:
            if cancelled:
                self._cancelled.add(key)
            running = [a for a in self._attempts.get(key, []) if a.dask is not None]
        for attempt in running:  # one not submitted yet sees the cancel in _start
            with attempt.events:
                if attempt.released:  # ended meanwhile: a set would make the event anew
                    continue
                try:
                    attempt.cancel.set()
                except Exception as exc:  # the scheduler is gone: the task is released with it
                    log.warning("could not signal the cancel", attempt=attempt.id, error=str(exc))
        return running

    def _wait(self, attempt: _Attempt, seconds: float) -> None:
        """Wait for the attempt's task to end, then release it (if it had not started)."""
        try:
            attempt.future.exception(seconds)
        except FutureTimeout:
            log.warning("remote copy did not stop in time", attempt=attempt.id)
        try:
            attempt.client.cancel(attempt.dask)
        except Exception:
            pass

    def _in_use(self) -> set[Any]:
        """The clients the running attempts were sent through."""
        with self._lock:
            return {a.client for g in self._attempts.values() for a in g}

    def _give_up(self, client: Any) -> None:
        """Fail the attempts sent through a client given up (transiently: the engine tries
        again, through a new client)."""
        with self._lock:
            stuck = [a for g in self._attempts.values() for a in g if a.client is client]
        scheduler, seconds = self._movers.scheduler, dask_client.GIVE_UP
        error = TransferError(
            f"the Dask scheduler {scheduler} was unreachable for {seconds:g} s", permanent=False
        )
        for attempt in stuck:
            self._resolve(attempt, error=error)

    def _shards(self, client: Any, spec: TransferSpec) -> int:
        """How many shards a transfer is split into, across the workers that have the
        resource (or ``[movers] shards``): a tree, unless the daemon's host sees it hold
        under ``[movers] split_min`` bytes; one file in byte ranges (or pieces a store
        assembles: ``backends.splits_files``) unless it sees it under ``range_min`` (a
        store's source it cannot see: each share plans it, and a small one is copied by
        share 0). A glob stays one task."""
        movers, local = self._movers, backends.backend(spec.source_kind).local
        if spec.part is not None or spec.glob:
            return 1
        if spec.tree:
            if local and planning.below(spec.source, True, movers.split_min):
                return 1
        elif not movers.range_min or not backends.splits_files(
            spec.source_kind, spec.destination_kind
        ):
            return 1
        elif local and planning.below(spec.source, False, movers.range_min):
            return 1
        if movers.shards:
            return movers.shards
        workers = client.scheduler_info().get("workers", {}).values()
        tag = movers.resources
        return max(1, sum(1 for w in workers if w.get("resources", {}).get(tag)))

    def _guarded(
        self, key: str, spec: TransferSpec, identity: Identity, on_event: Sink, future: Future[Done]
    ) -> None:
        """Split the transfer into its attempts and start them; whatever happens, the
        future gets an outcome."""
        base = f"{key}.{uuid.uuid4().hex[:12]}"
        try:
            client = self._connection.ready(lambda: key in self._cancelled or self._closing)
            count = self._shards(client, spec)
        except Exception as exc:
            with self._lock:
                self._attempts.pop(key, None)
            future.set_exception(Cancelled() if key in self._cancelled else self._unreachable(exc))
            return
        if count == 1:
            whole = spec.part or TreeShard(0, 1)
            attempts = [(_Attempt(key, base, on_event, future, on_event, whole), spec)]
        else:
            split = Split(count, on_event, future, lambda: self._signal(key, cancelled=False))
            # One file's ranges write one temporary file, named after their group.
            group = uuid.uuid4().hex[:8]
            shards: list[TreeShard | FileRange] = [
                TreeShard(i, count)
                if spec.tree
                else FileRange(i, count, group, self._movers.range_min)
                for i in range(count)
            ]
            attempts = [
                (_Attempt(key, f"{base}/{i}", split.event(i), split.outcome(), on_event,
                          shard),
                 spec.but(part=shard))
                for i, shard in enumerate(shards)
            ]  # fmt: skip
        with self._lock:
            for attempt, _ in attempts:
                attempt.where = f"{spec.source} -> {spec.destination}"
            self._attempts.setdefault(key, []).extend(a for a, _ in attempts)
        self._watchdog.start()
        for attempt, shard_spec in attempts:
            try:
                attempt.tell(attempt.update())  # recorded before it is submitted
            except Exception as exc:
                error = TransferError(f"could not record the attempt: {exc}", permanent=False)
                self._resolve(attempt, error=error)
                continue
            try:
                self._start(client, attempt, shard_spec, identity)
            except Exception as exc:
                self._resolve(attempt, error=self._unreachable(exc))

    def _watched(self) -> list[_Attempt]:
        with self._lock:
            return [a for g in self._attempts.values() for a in g if a.dask is not None]

    def _stalled(self, attempt: _Attempt) -> None:
        """The watchdog's verdict: stop the attempt as a cancel does (its task kills the copy
        and removes its temporary files); its end fails it transiently with the reason. A
        node that does not end it within ``CANCEL_WAIT`` s: failed here, its task cancelled."""
        attempt.stalled = stall.said(attempt.where, self._watchdog.timeout)
        metrics.STALLS.inc()
        log.warning("attempt stalled: stopped", attempt=attempt.id, node=attempt.node,
                    reason=attempt.stalled)  # fmt: skip
        with attempt.events:
            if not attempt.released:
                try:
                    attempt.cancel.set()
                except Exception as exc:
                    log.warning("could not signal the stop", attempt=attempt.id, error=str(exc))
        self._threads.submit(self._stop_stalled, attempt)

    def _stop_stalled(self, attempt: _Attempt) -> None:
        self._wait(attempt, CANCEL_WAIT)
        error = TransferError(f"{attempt.stalled} (its node did not stop it)", permanent=False)
        self._resolve(attempt, error=error)  # nothing if it ended meanwhile

    def _unreachable(self, exc: Exception) -> TransferError:
        """A transient failure to hand work to the scheduler: the engine tries again."""
        return TransferError(
            f"could not submit to the Dask scheduler {self._movers.scheduler}: {exc}",
            permanent=False,
        )

    def _start(
        self, client: Any, attempt: _Attempt, spec: TransferSpec, identity: Identity
    ) -> None:
        from distributed import Event as DaskEvent

        if attempt.key in self._cancelled or self._closing:
            self._resolve(attempt, error=Cancelled())
            return
        client.subscribe_topic(attempt.id, lambda event: self._event(attempt, event[1]))
        cancel_name = dask_task.cancel_event(attempt.id)
        with self._lock:
            if attempt.key in self._cancelled or self._closing:
                cancelled = True
            else:
                cancelled = False
                attempt.client = client
                attempt.cancel = DaskEvent(cancel_name, client=client)
                attempt.dask = client.submit(
                    dask_task.run_attempt,
                    attempt.id,
                    spec,
                    identity.uid,
                    identity.gid,
                    cancel_name,
                    key=f"bbstage-{attempt.id}",
                    resources={self._movers.resources: 1},
                    pure=False,
                    retries=0,
                )
        if cancelled:
            self._resolve(attempt, error=Cancelled())
            return
        log.info("transfer submitted", key=attempt.key, attempt=attempt.id)
        # The callback runs on the client's event loop: wait for the result elsewhere.
        attempt.dask.add_done_callback(lambda _f: self._threads.submit(self._settled, attempt))

    def _event(self, attempt: _Attempt, msg: Any) -> None:
        """An event from the attempt's task (on the client's event loop)."""
        if not isinstance(msg, dict):
            return
        node = msg.get("node")
        if msg.get("started") is True:  # the task runs: the stall watchdog counts from now
            with self._lock:
                attempt.heard = time.monotonic()
            return
        # "worker" is added by Dask's log_event, "node" by run_attempt.
        try:
            event = codec.from_dict({k: v for k, v in msg.items() if k not in ("node", "worker")})
        except codec.CodecError:
            return
        with self._lock:
            if attempt.finished or not isinstance(event, Planned | Moved):
                return
            attempt.heard = time.monotonic()  # it runs, and is not stalled
            if isinstance(node, str):
                attempt.node = node
            if isinstance(event, Moved):
                attempt.moved = event
            attempt.on_event(event)
            attempt.tell(attempt.update())

    def _settled(self, attempt: _Attempt) -> None:
        """Whatever happens, the future gets an outcome."""
        try:
            self._settle(attempt)
        except Exception as exc:
            self._resolve(attempt, error=TransferError(f"internal error: {exc!r}"))

    def _settle(self, attempt: _Attempt) -> None:
        """The task ended: its outcome becomes the future's."""
        try:
            result = attempt.dask.result()
        except Exception as exc:
            if attempt.key in self._cancelled:
                self._resolve(attempt, error=Cancelled())
            else:  # e.g. lost with a scheduler that restarted: the engine tries again
                reason = (
                    "lost (cancelled by Dask)" if attempt.dask.cancelled() else f"failed: {exc}"
                )
                self._resolve(attempt, error=TransferError(f"Dask task {reason}", permanent=False))
            return
        outcome, planned, node = result.get("outcome"), result.get("planned"), result.get("node")
        log.info("transfer ended", attempt=attempt.id, node=node,
                 outcome=type(outcome).__name__)  # fmt: skip
        if isinstance(node, str):
            with self._lock:
                attempt.node = node
        if attempt.key in self._cancelled:
            self._resolve(attempt, error=Cancelled())
        elif attempt.stalled:  # stopped by the watchdog (its node removed the temp files)
            self._resolve(attempt, error=TransferError(attempt.stalled, permanent=False))
        elif isinstance(outcome, Done):
            self._resolve(attempt, planned=planned, done=outcome)
        elif isinstance(outcome, Failed):
            self._resolve(
                attempt, error=TransferError(outcome.message, permanent=outcome.permanent)
            )
        else:
            self._resolve(attempt, error=TransferError(f"bad task result: {result!r}"))

    def _resolve(
        self,
        attempt: _Attempt,
        *,
        planned: Planned | None = None,
        done: Done | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Hand over the plan, then close the attempt to events, tell its end, resolve its
        future, and delete its Dask events."""
        with self._lock:
            if attempt.finished:
                return
            if planned is not None:
                attempt.on_event(planned)
            attempt.finished = True
            group = self._attempts.get(attempt.key)
            if group is not None and attempt in group:
                group.remove(attempt)
                if not group:
                    del self._attempts[attempt.key]
        if attempt.client is not None:
            try:
                attempt.client.unsubscribe_topic(attempt.id)
            except Exception:
                pass
        error = None if done is not None else error or TransferError("no outcome")
        self._tell_end(attempt, done, error)
        if done is not None:
            attempt.future.set_result(done)
        else:
            attempt.future.set_exception(error)
        self._release(attempt)

    def _tell_end(self, attempt: _Attempt, done: Done | None, error: BaseException | None) -> None:
        """The attempt's last ``AttemptUpdate``: a done one's counts are its manifest's."""
        if done is not None:
            attempt.moved = Moved(done.bytes, done.files)
            update = attempt.update(AttemptState.DONE)
        elif isinstance(error, Cancelled):
            update = attempt.update(AttemptState.CANCELLED)
        else:
            update = attempt.update(AttemptState.FAILED, str(error))
        try:
            attempt.tell(update)
        except Exception as exc:  # e.g. the daemon closed its state while shutting down
            log.warning("could not record the attempt's end", attempt=attempt.id, error=str(exc))

    def _release(self, attempt: _Attempt) -> None:
        """Delete the attempt's Dask events on the scheduler: an event cleared while nobody
        waits on it is deleted (``distributed.event.EventExtension.event_clear``). Only once
        its outcome is final here: until then a rerun of its task must find ``started``.
        Through a client that is not connected (a scheduler that restarted, one given up),
        asking waits for the scheduler: in a thread of its own, not the executor's."""
        with attempt.events:
            attempt.released = True  # no set after this: it would make the event anew
            if attempt.dask is None:  # never submitted
                return
        if connected(attempt.client):
            _clear(attempt)
        else:
            threading.Thread(target=_clear, args=(attempt,), daemon=True).start()


def _clear(attempt: _Attempt) -> None:
    from distributed import Event as DaskEvent

    for name in dask_task.events(attempt.id):
        try:
            DaskEvent(name, client=attempt.client).clear()
        except Exception as exc:  # the scheduler is gone, and its events with it
            log.warning("could not delete a Dask event", dask_event=name, error=str(exc))
