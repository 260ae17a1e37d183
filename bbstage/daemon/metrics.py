"""Prometheus metrics (prometheus_client), served on loopback by default.

Counters and histograms count the engine's events (``observe``, which the daemon subscribes);
gauges that describe the current state (pools, jobs, queue depth) are read from the store and
the executor at scrape time.

The endpoint (``Endpoint``) is a small HTTP/1.1 server on the daemon's event loop, not
prometheus_client's thread-per-connection server: any local user can connect to it, and the
daemon is root. At most ``MAX_CONNECTIONS`` connections are open; a new one beyond that
closes the oldest that has not yet sent its whole request (so idle connections cannot keep
a scrape out), and a request head must arrive within ``READ_TIMEOUT`` seconds (a slowloris
is closed). The page is prometheus_client's ``generate_latest``, one at a time, in a thread.
"""

from __future__ import annotations

import asyncio
import platform
import pwd
import threading
from collections.abc import Iterator
from typing import Protocol

import structlog
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bbstage import __version__
from bbstage.config import Config
from bbstage.daemon import report
from bbstage.daemon.events import EngineEvent, HookAnswered, TransferEnded
from bbstage.daemon.state import Store
from bbstage.daemon.usage import Usage

log = structlog.get_logger("bbstage.daemon.metrics")

BYTES = Counter("bbstage_staged_bytes", "Bytes staged", ["direction"])
FILES = Counter("bbstage_staged_files", "Files staged", ["direction"])
TRANSFERS = Counter("bbstage_transfers", "Finished directive transfers", ["direction", "outcome"])
DURATION = Histogram(
    "bbstage_transfer_duration_seconds",
    "Time to stage one directive",
    ["direction"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, float("inf")),
)
HOOKS = Counter("bbstage_hook_requests", "Requests from the Slurm hooks", ["hook", "status"])
USER_BYTES = Counter(
    "bbstage_user_staged_bytes", "Bytes staged, by job owner", ["user", "direction"]
)
STALLS = Counter(
    "bbstage_transfer_stalls",
    "Transfer attempts the stall watchdog stopped (nothing moved for stall_timeout)",
)
BUILD = Gauge(
    "bbstage_build_info",
    "The daemon's bbstage and Python versions (always 1)",
    ["version", "python"],
)
BUILD.labels(__version__, platform.python_version()).set(1)

# Per-user series are labelled with the user's name (the uid when it has none). Bounded: the
# queued/running gauges list only the users with transfers queued or running at the scrape;
# the bytes counter keeps at most USER_LABELS users per daemon run, later ones under OTHER.
USER_LABELS = 200
OTHER = "_other"
_named: set[str] = set()
_named_lock = threading.Lock()


def user_label(uid: int, keep: bool = False) -> str:
    """The ``user`` label of ``uid``; ``keep``: for a lasting series (a counter), which
    takes one of the ``USER_LABELS`` places or is ``OTHER``."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    if not keep:
        return name
    with _named_lock:
        if name not in _named and len(_named) >= USER_LABELS:
            return OTHER
        _named.add(name)
    return name


class Queue(Protocol):
    """What the gauges read of an executor."""

    @property
    def running(self) -> int: ...
    @property
    def queued(self) -> int: ...
    def users(self) -> dict[int, tuple[int, int]]: ...


class StateCollector(Collector):
    """Gauges computed when Prometheus scrapes."""

    def __init__(
        self, config: Config, store: Store, executor: Queue, usage: Usage | None = None
    ) -> None:
        self.config, self.store, self.executor, self.usage = config, store, executor, usage

    def collect(self) -> Iterator[Metric]:
        active = GaugeMetricFamily("bbstage_transfers_active", "Transfers running now")
        active.add_metric([], self.executor.running)
        yield active
        queued = GaugeMetricFamily(
            "bbstage_transfers_queued", "Transfers waiting for a worker slot"
        )
        queued.add_metric([], self.executor.queued)
        yield queued
        user_queued = GaugeMetricFamily(
            "bbstage_user_transfers_queued", "Transfers waiting, by owner", labels=["user"]
        )
        user_running = GaugeMetricFamily(
            "bbstage_user_transfers_running", "Transfers running, by owner", labels=["user"]
        )
        for uid, (waiting, running) in self.executor.users().items():
            user_queued.add_metric([user_label(uid)], waiting)
            user_running.add_metric([user_label(uid)], running)
        yield user_queued
        yield user_running
        jobs = GaugeMetricFamily("bbstage_jobs", "Jobs known to the daemon", labels=["state"])
        for state, n in sorted(self.store.counts().items()):
            jobs.add_metric([state], n)
        yield jobs
        capacity = GaugeMetricFamily(
            "bbstage_pool_capacity_bytes", "Scratch pool capacity", labels=["pool"]
        )
        reserved = GaugeMetricFamily(
            "bbstage_pool_reserved_bytes", "Capacity reserved by active jobs", labels=["pool"]
        )
        used = GaugeMetricFamily(
            "bbstage_pool_used_bytes",
            "What active jobs' scratch holds (last measure)",
            labels=["pool"],
        )
        over = GaugeMetricFamily(
            "bbstage_jobs_over_capacity", "Active jobs whose scratch holds more than they"
            " reserved (capacity=)", labels=["pool"],
        )  # fmt: skip
        for name, pool in report.pools(self.config, self.store, self.usage).items():
            capacity.add_metric([name], pool["capacity"])
            reserved.add_metric([name], pool["reserved"])
            used.add_metric([name], pool["used"])
            over.add_metric([name], pool["over"])
        yield capacity
        yield reserved
        yield used
        yield over


MAX_CONNECTIONS = 64  # open at once
READ_TIMEOUT = 5.0  # seconds for a connection to send its whole request head
WRITE_TIMEOUT = 10.0  # seconds for it to take the answer
MAX_HEAD = 8192  # bytes of a request head


class Endpoint:
    """The HTTP endpoint on the event loop: ``GET /metrics`` (or ``/``), bounded."""

    def __init__(self) -> None:
        self._open: dict[asyncio.Task[None], None] = {}  # oldest first
        self._reading: dict[asyncio.Task[None], None] = {}  # those still reading their head
        self._page = asyncio.Lock()  # one page generated at a time
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._open):
                task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._open) >= MAX_CONNECTIONS:
            if not self._reading:  # all busy answering: this one waits for no one
                writer.transport.abort()
                return
            oldest = next(iter(self._reading))  # idle or slow: it makes room
            self._reading.pop(oldest)
            self._open.pop(oldest)
            oldest.cancel()
        self._open[task] = self._reading[task] = None
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            finally:
                self._reading.pop(task, None)
            writer.write(await self._answer(head))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # slow, cut short, too long or gone: closed below
        finally:
            self._open.pop(task, None)
            writer.transport.abort()

    async def _answer(self, head: bytes) -> bytes:
        method, target = (head.split(b"\r\n", 1)[0].split(b" ") + [b"", b""])[:2]
        if method not in (b"GET", b"HEAD"):
            return _response(b"405 Method Not Allowed", b"text/plain", b"GET only\n", method)
        if target.split(b"?", 1)[0] not in (b"/metrics", b"/"):
            return _response(b"404 Not Found", b"text/plain", b"see /metrics\n", method)
        async with self._page:
            page = await asyncio.to_thread(generate_latest, REGISTRY)
        return _response(b"200 OK", CONTENT_TYPE_LATEST.encode(), page, method)


def _response(status: bytes, kind: bytes, body: bytes, method: bytes) -> bytes:
    head = b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
    return head % (status, kind, len(body)) + (body if method != b"HEAD" else b"")


async def serve(
    config: Config, store: Store, executor: Queue, address: str, usage: Usage | None = None
) -> Endpoint | None:
    """Start the HTTP endpoint on ``host:port`` on the running loop; empty address: off."""
    if not address:
        return None
    host, _, port = address.rpartition(":")
    REGISTRY.register(StateCollector(config, store, executor, usage))
    endpoint = Endpoint()
    try:
        await endpoint.start(host or "127.0.0.1", int(port))
    except OSError as exc:  # staging matters more than metrics: keep running
        log.error("metrics endpoint not started", address=address, error=str(exc))
        return None
    return endpoint


def observe(event: EngineEvent) -> None:
    """Count one engine event (the daemon subscribes this to the engine)."""
    if isinstance(event, HookAnswered):
        HOOKS.labels(event.op, event.status).inc()
    elif isinstance(event, TransferEnded):
        TRANSFERS.labels(event.direction, event.outcome).inc()
        DURATION.labels(event.direction).observe(event.seconds)
        if event.outcome == "done":
            BYTES.labels(event.direction).inc(event.bytes)
            FILES.labels(event.direction).inc(event.files)
            if event.uid is not None:
                USER_BYTES.labels(user_label(event.uid, keep=True), event.direction).inc(
                    event.bytes
                )
