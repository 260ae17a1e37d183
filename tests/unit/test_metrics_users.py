"""Per-user metrics: queued and running by owner at scrape time, bytes by owner, bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bbstage.config import Config
from bbstage.daemon import metrics
from bbstage.daemon.events import TransferEnded
from bbstage.daemon.state import Store


class Executor:
    running, queued = 3, 5

    def users(self) -> dict[int, tuple[int, int]]:
        return {0: (4, 1), 65534: (1, 2), 4242424: (0, 0)}


def test_queued_and_running_are_told_per_user_by_name(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    registry.register(metrics.StateCollector(Config(), Store(tmp_path / "s.db"), Executor()))
    text = generate_latest(registry).decode()
    assert 'bbstage_user_transfers_queued{user="root"} 4.0' in text
    assert 'bbstage_user_transfers_running{user="nobody"} 2.0' in text
    assert 'bbstage_user_transfers_running{user="4242424"} 0.0' in text  # no name: the uid


def test_bytes_per_user_keep_a_bounded_number_of_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "USER_LABELS", 2)
    monkeypatch.setattr(metrics, "_named", set())
    for uid in (0, 65534, 4242424, 4242425):
        metrics.observe(TransferEnded("in", "done", 1.0, 10, 1, uid))
    assert metrics.USER_BYTES.labels("root", "in")._value.get() >= 10
    assert metrics._named == {"root", "nobody"}
    assert metrics.user_label(4242426, keep=True) == metrics.OTHER
    assert metrics.USER_BYTES.labels(metrics.OTHER, "in")._value.get() >= 20
