"""Within one user, jobs Slurm expects to start first are staged first: the engine takes
``start_time`` and ``priority`` from the hooks' request (24.05+ ``job_info``, once
lua/bbstage/hooks.lua forwards them) and the fair-share queue serves a user's waiting
transfers in that order; a job without them waits behind those that have them."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import Any

from bbstage.daemon import fairshare
from bbstage.daemon.engine import Engine
from bbstage.protocol import Request
from bbstage.transfer import Done, Planned, TransferSpec
from tests.unit.test_engine import engine, setup

__all__ = ["engine"]  # the fixture


class OneSlot:
    """An executor of one slot behind the real fair-share queue: ``started`` in the order
    the policy picks; ``finish`` ends the running transfer."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._futures: dict[str, Future[Done]] = {}
        self.submitted = self._futures  # what tests/unit/test_engine.py's helpers read
        self.queue: fairshare.Queue[Any] = fairshare.Queue(fairshare.Policy(1), self._start)

    def _start(self, key: str, item: Any) -> None:
        self.started.append(key.split(":")[0])

    def submit(self, key: str, spec: TransferSpec, identity: Any, on_event: Any,
               order: tuple[Any, ...] = ()) -> Future[Done]:  # fmt: skip
        on_event(Planned(1, 1))
        self._futures[key] = Future()
        self.queue.add(key, identity.uid, order, None)
        return self._futures[key]

    def finish(self) -> None:
        key = f"{self.started[-1]}:0"
        self.queue.release(key)
        self._futures[key].set_result(Done(1, 1))


def test_a_users_jobs_are_staged_by_expected_start_then_priority_then_arrival(
    engine: Engine,
) -> None:
    one = engine.executor = OneSlot()  # type: ignore[assignment]
    asked = {  # job: what its data_in hook sends, in the order they are asked
        "80": {},
        "81": {"start_time": 1800000000, "priority": 10},
        "82": {},
        "83": {"start_time": 1700000000, "priority": 10},
        "84": {"start_time": 1800000000, "priority": 500},
    }
    for job in asked:
        setup(engine, job, "stage_in source=/a/ destination=/b/")

    async def scenario() -> None:
        for job, fields in asked.items():
            await engine.handle(Request("data_in", {"job_id": job, "wait": False, **fields}))
        for _ in range(len(asked) - 1):
            one.finish()
            await asyncio.sleep(0)

    asyncio.run(scenario())
    # 80 took the free slot; then the earliest start, the higher priority, arrival order
    assert one.started == ["80", "83", "84", "81", "82"]
