"""Prometheus metrics (prometheus_client), served on loopback by default.

Counters and histograms count the engine's events (``observe``, which the daemon subscribes);
gauges that describe the current state (pools, jobs, queue depth) are read from the store and
the executor at scrape time.
"""

from __future__ import annotations

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


class Queue(Protocol):
    """What the gauges read of an executor."""

    @property
    def running(self) -> int: ...
    @property
    def queued(self) -> int: ...


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
