"""Runs transfers as tasks on a Dask distributed cluster of data-transfer nodes.

The same two methods as ``bbstage.executor.TransferExecutor`` (``submit``, ``cancel``):
the daemon stays the source of truth, Dask is a disposable executor. Each submitted
transfer is one attempt (an id in the log and in the task's key) that runs
``bbstage.remote.run_attempt`` on a worker with one unit of the configured resource;
there the copy runs in a child process as the job's user. Progress comes back on the
attempt's ``log_event`` topic; the outcome is the task's result, and its ``Planned`` is
handed to ``on_event`` before the future resolves, so the engine's check "the manifest
covers the plan" always has this attempt's plan, and nothing of the attempt reaches
``on_event`` after it.

Dask does not stop a running task, so ``cancel`` sets the attempt's ``distributed.Event``
(the task polls it and kills the copy's process group) and waits for the task to end.
``distributed`` is imported only here, only when ``[movers] engine = "dask"``.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import structlog

from bbstage import remote
from bbstage.config import Movers
from bbstage.identity import Identity
from bbstage.movers import Cancelled, TransferError
from bbstage.transfer import Done, Failed, Moved, Planned, TransferSpec

log = structlog.get_logger("bbstage.dask")

CANCEL_WAIT = 5.0  # seconds cancel waits for the remote copy to be stopped
CONNECT_TIMEOUT = 10.0


@dataclass
class _Attempt:
    key: str
    id: str
    on_event: Any
    future: Future[Done]
    dask: Any = None  # distributed.Future, once submitted
    cancel: Any = None  # distributed.Event
    node: str = ""
    finished: bool = False


class DaskExecutor:
    def __init__(self, movers: Movers, max_workers: int = 4, client: Any = None) -> None:
        """``client``: an existing ``distributed.Client`` (tests); else one is made, with
        the configured certificates, at the first ``submit``."""
        self._movers = movers
        self._client: Any = client
        self._lock = threading.Lock()
        self._connecting = threading.Lock()
        self._attempts: dict[str, _Attempt] = {}
        self._cancelled: set[str] = set()
        self._closing = False
        # Connecting and waiting on results block: never on the daemon's event loop.
        self._threads = ThreadPoolExecutor(max(4, max_workers), thread_name_prefix="dask")

    @property
    def running(self) -> int:
        """Attempts submitted and not finished."""
        return len(self._attempts)

    @property
    def idle(self) -> int:
        return 0

    @property
    def queued(self) -> int:
        return 0

    def nodes(self) -> dict[str, str]:
        """Which node runs which transfer (key → node), as far as events told."""
        with self._lock:
            return {k: a.node for k, a in self._attempts.items() if a.node}

    def submit(self, key: str, spec: TransferSpec, identity: Identity, on_event: Any) -> Future:
        """Start a transfer on the cluster; ``on_event`` gets ``Planned`` and ``Moved``."""
        future: Future[Done] = Future()
        attempt = _Attempt(key, f"{key}.{uuid.uuid4().hex[:12]}", on_event, future)
        with self._lock:
            self._cancelled.discard(key)
            self._attempts[key] = attempt
        self._threads.submit(self._guarded, attempt, spec, identity)
        return future

    def cancel(self, key: str) -> None:
        """Stop a transfer: its task kills the remote copy; wait until it did."""
        attempt = self._signal(key)
        if attempt is not None:
            self._wait(attempt, CANCEL_WAIT)

    def shutdown(self) -> None:
        """Cancel every running attempt (they resume on the next start) and disconnect."""
        with self._lock:
            self._closing = True
            keys = list(self._attempts)
        attempts = [a for a in map(self._signal, keys) if a is not None]
        for attempt in attempts:
            self._wait(attempt, CANCEL_WAIT / len(attempts))
        self._threads.shutdown(wait=False)
        if self._client is not None:
            try:
                self._client.close(timeout=5)
            except Exception:
                pass

    def _signal(self, key: str) -> _Attempt | None:
        """Mark ``key`` cancelled and set its attempt's event; the attempt if it runs."""
        with self._lock:
            self._cancelled.add(key)
            attempt = self._attempts.get(key)
        if attempt is None or attempt.dask is None:
            return None  # not submitted yet: _start sees the cancel
        try:
            attempt.cancel.set()
        except Exception as exc:  # the scheduler is gone: the task is released with it
            log.warning("could not signal the cancel", attempt=attempt.id, error=str(exc))
        return attempt

    def _wait(self, attempt: _Attempt, seconds: float) -> None:
        """Wait for the attempt's task to end, then release it (if it had not started)."""
        try:
            attempt.future.exception(seconds)
        except FutureTimeout:
            log.warning("remote copy did not stop in time", attempt=attempt.id)
        try:
            self._client.cancel(attempt.dask)
        except Exception:
            pass

    def _connect(self) -> Any:
        with self._connecting:
            if self._client is None:
                from distributed import Client
                from distributed.security import Security

                movers = self._movers
                security = Security(
                    tls_ca_file=str(movers.tls_ca_file),
                    tls_client_cert=str(movers.tls_cert),
                    tls_client_key=str(movers.tls_key),
                    require_encryption=True,
                )
                self._client = Client(
                    movers.scheduler,
                    security=security,
                    timeout=CONNECT_TIMEOUT,
                    set_as_default=False,
                )
            return self._client

    def _guarded(self, attempt: _Attempt, spec: TransferSpec, identity: Identity) -> None:
        try:
            self._start(attempt, spec, identity)
        except Exception as exc:
            self._resolve(
                attempt,
                error=TransferError(
                    f"could not submit to the Dask scheduler {self._movers.scheduler}: {exc}",
                    permanent=False,
                ),
            )

    def _start(self, attempt: _Attempt, spec: TransferSpec, identity: Identity) -> None:
        from distributed import Event as DaskEvent

        if attempt.key in self._cancelled or self._closing:
            self._resolve(attempt, error=Cancelled())
            return
        client = self._connect()
        client.subscribe_topic(attempt.id, lambda event: self._event(attempt, event[1]))
        cancel_name = f"bbstage-cancel-{attempt.id}"
        with self._lock:
            if attempt.key in self._cancelled or self._closing:
                cancelled = True
            else:
                cancelled = False
                attempt.cancel = DaskEvent(cancel_name, client=client)
                attempt.dask = client.submit(
                    remote.run_attempt,
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
        # "worker" is added by Dask's log_event, "node" by run_attempt.
        event = remote.from_json({k: v for k, v in msg.items() if k not in ("node", "worker")})
        with self._lock:
            if attempt.finished or not isinstance(event, Planned | Moved):
                return
            if isinstance(node, str):
                attempt.node = node
            attempt.on_event(event)

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
            if attempt.key in self._cancelled or attempt.dask.cancelled():
                self._resolve(attempt, error=Cancelled())
            else:
                self._resolve(
                    attempt, error=TransferError(f"Dask task failed: {exc}", permanent=False)
                )
            return
        outcome, planned = result.get("outcome"), result.get("planned")
        log.info("transfer ended", attempt=attempt.id, node=result.get("node"),
                 outcome=type(outcome).__name__)  # fmt: skip
        if attempt.key in self._cancelled:
            self._resolve(attempt, error=Cancelled())
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
        """Hand over the plan, then close the attempt to events, then resolve its future."""
        with self._lock:
            if attempt.finished:
                return
            if planned is not None:
                attempt.on_event(planned)
            attempt.finished = True
            if self._attempts.get(attempt.key) is attempt:
                del self._attempts[attempt.key]
        if self._client is not None:
            try:
                self._client.unsubscribe_topic(attempt.id)
            except Exception:
                pass
        if done is not None:
            attempt.future.set_result(done)
        else:
            attempt.future.set_exception(error or TransferError("no outcome"))
