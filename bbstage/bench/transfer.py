"""Our contender: the transfer as a job would run it, through :func:`bbstage.transfer.worker.run`
with a spec built as the engine builds one, by ``TransferSpec.of_directive`` (same planning,
concurrency, movers, retries)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from bbstage.bench.model import BenchError, Plan, Run
from bbstage.config import Config, Movers
from bbstage.identity import Identity
from bbstage.movers import FileTask
from bbstage.transfer import AttemptUpdate, Done, Moved, Planned, TransferSpec, worker

SAMPLE_EVERY = 0.1  # seconds between throughput samples


class BenchReporter:
    """The worker's progress sink: counts bytes and files, times each file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes = self.files = 0
        self.planned: tuple[int, int] | None = None
        self.latencies: list[float] = []
        self.temps: list[str] = []

    def send(self, event: Any) -> None:
        if isinstance(event, Planned):
            self.planned = (event.bytes, event.files)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.bytes += nbytes

    def file_done(self, task: FileTask, seconds: float | None = None) -> None:
        with self._lock:
            self.files += 1
            if seconds is not None:
                self.latencies.append(seconds)

    def temp(self, path: str) -> None:
        self.temps.append(path)

    def moved(self, event: Moved | Done) -> None:
        """Counts so far from a remote transfer (its events carry totals, not steps)."""
        with self._lock:
            self.bytes, self.files = event.bytes, event.files

    def flush(self) -> None:
        pass


def make_spec(
    source: str,
    destination: str,
    source_kind: str,
    destination_kind: str,
    config: Config,
    *,
    tree: bool,
    checksum: str = "none",
    profile: str | None = None,
) -> TransferSpec:
    """A transfer spec built as the engine builds a directive's (``TransferSpec.of_directive``),
    with the caller's mapped credentials (bench runs as the admin who calls it)."""
    options = {"checksum": checksum, "overwrite": "always"}
    if profile:
        options["profile"] = profile
    directive = {
        "source": source,
        "destination": destination,
        "source_kind": source_kind,
        "destination_kind": destination_kind,
        "tree": tree,
        "options": options,
    }
    return TransferSpec.of_directive(
        f"bench-{os.getpid()}",
        directive,
        uid=os.getuid(),
        backend_settings=config.backend_settings,
        threads=config.threads_per_transfer,
        chunk_size=config.chunk_size,
    )


class DaskRunner:
    """Our transfer submitted to the configured Dask cluster (``bbstage bench --executor
    dask``) as ``owner``, through the executor the daemon uses: the nodes copy, split
    into shards or ranges as a job's transfer is. ``nodes``: where attempts ran."""

    def __init__(self, movers: Movers, owner: Identity, client: Any = None) -> None:
        from bbstage.daemon.dask_executor import DaskExecutor

        self._executor = DaskExecutor(movers, client=client)
        self._owner = owner
        self.nodes: set[str] = set()

    def __call__(
        self, spec: TransferSpec, reporter: BenchReporter, cancel: threading.Event
    ) -> None:
        key = f"{spec.job_id}:{uuid.uuid4().hex[:8]}"

        def on_event(event: Any) -> None:
            if isinstance(event, AttemptUpdate):
                if event.node:
                    self.nodes.add(event.node)
            elif isinstance(event, Moved):
                reporter.moved(event)
            else:
                reporter.send(event)

        future = self._executor.submit(key, spec, self._owner, on_event)
        while True:
            try:
                done = future.result(timeout=SAMPLE_EVERY)
                break
            except FutureTimeout:
                if cancel.is_set():
                    self._executor.cancel(key)
        reporter.moved(done)

    def close(self) -> None:
        """Disconnect (a client given by the caller stays open)."""
        self._executor.shutdown()


def run_transfer(
    spec: TransferSpec, expect: Plan, show: Callable[..., Any] | None, runner: Any = None
) -> Run:
    """Run ``worker.run(spec)`` in a thread (or ``runner``, e.g. a ``DaskRunner``),
    sampling progress every SAMPLE_EVERY seconds."""
    reporter, cancel = BenchReporter(), threading.Event()
    failure: list[BaseException] = []

    def target() -> None:
        try:
            (runner or worker.run)(spec, reporter, cancel)
        except BaseException as exc:  # reported below, in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=target, name="bench-transfer", daemon=True)
    samples: list[tuple[float, int, int]] = [(0.0, 0, 0)]
    start = time.perf_counter()
    thread.start()
    try:
        while thread.is_alive():
            thread.join(SAMPLE_EVERY)
            samples.append((time.perf_counter() - start, reporter.bytes, reporter.files))
            if show:
                show(reporter.bytes, reporter.files)
    except KeyboardInterrupt:
        cancel.set()
        thread.join()
        raise
    seconds = time.perf_counter() - start
    samples[-1] = (seconds, reporter.bytes, reporter.files)
    if failure:
        raise failure[0]
    if reporter.files != expect.files or reporter.bytes != expect.total:
        raise BenchError(
            f"the transfer copied {reporter.files} files / {reporter.bytes} bytes, "
            f"expected {expect.files} / {expect.total}"
        )
    return Run(seconds, reporter.bytes, reporter.files, reporter.latencies, samples)
