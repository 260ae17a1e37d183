"""The reconciler: dead jobs are torn down at once, missing ones only after a grace period."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from bbstage import reconcile


class FakeEngine:
    def __init__(self, jobs: dict[str, str]) -> None:
        self.jobs = jobs
        self.torn: list[str] = []
        self.config = SimpleNamespace(slurm_conf=None)
        self.store = SimpleNamespace(
            jobs=lambda states: [
                SimpleNamespace(job_id=i, state=s) for i, s in self.jobs.items() if s in states
            ]
        )

    async def handle(self, request: Any) -> None:
        self.torn.append(request.fields["job_id"])
        self.jobs[request.fields["job_id"]] = "cancelled"


def run(engine: FakeEngine, states: dict[str, str], missing: dict[str, float]) -> list[str]:
    async def fake_states(job_ids: list[str], conf: str | None) -> dict[str, str]:
        return states

    reconcile.slurm_states = fake_states  # type: ignore[assignment]
    return asyncio.run(reconcile.once(engine, missing))  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def restore(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconcile, "slurm_states", reconcile.slurm_states)


def test_cancelled_before_running_is_torn_down_at_once() -> None:
    engine = FakeEngine({"1": "staging_in", "2": "staging_in", "3": "staging_out"})
    torn = run(engine, {"1": "CANCELLED", "2": "PENDING", "3": "COMPLETED"}, {})
    assert torn == ["1"]  # 3 is a finished job staging out: that is normal


def test_missing_job_waits_for_the_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine({"7": "staging_in"})
    missing: dict[str, float] = {}
    clock = [1000.0]
    monkeypatch.setattr(reconcile.time, "monotonic", lambda: clock[0])
    assert run(engine, {}, missing) == []
    clock[0] += reconcile.MISSING_GRACE - 1
    assert run(engine, {}, missing) == []
    clock[0] += 2
    assert run(engine, {}, missing) == ["7"]


def test_a_job_that_reappears_is_forgiven(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine({"8": "staging_in"})
    missing: dict[str, float] = {}
    clock = [0.0]
    monkeypatch.setattr(reconcile.time, "monotonic", lambda: clock[0])
    run(engine, {}, missing)
    run(engine, {"8": "PENDING"}, missing)
    assert missing == {}
    clock[0] += reconcile.MISSING_GRACE * 2
    assert run(engine, {}, missing) == []
