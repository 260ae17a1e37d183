"""Prometheus metrics (prometheus_client), served on loopback by default.

Counters and histograms count the engine's events (``observe``, which the daemon subscribes);
gauges that describe the current state (pools, jobs, queue depth) are read from the store and
the executor at scrape time.
"""

from __future__ import annotations

import pwd
import threading
from collections.abc import Iterator
from typing import Protocol

import structlog
from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bbstage import report
from bbstage.config import Config
from bbstage.events import EngineEvent, HookAnswered, TransferEnded
from bbstage.state import Store

log = structlog.get_logger("bbstage.metrics")

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

    def __init__(self, config: Config, store: Store, executor: Queue) -> None:
        self.config, self.store, self.executor = config, store, executor

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
        for name, pool in report.pools(self.config, self.store).items():
            capacity.add_metric([name], pool["capacity"])
            reserved.add_metric([name], pool["reserved"])
        yield capacity
        yield reserved


def serve(config: Config, store: Store, executor: Queue, address: str) -> None:
    """Start the HTTP endpoint (a daemon thread) on ``host:port``; empty address: off."""
    if not address:
        return
    host, _, port = address.rpartition(":")
    REGISTRY.register(StateCollector(config, store, executor))
    try:
        start_http_server(int(port), addr=host or "127.0.0.1")
    except OSError as exc:  # staging matters more than metrics: keep running
        log.error("metrics endpoint not started", address=address, error=str(exc))


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
