"""The stall watchdog on the Dask executor, on an in-process ``LocalCluster`` as
tests/unit/test_dask_executor.py runs it: an attempt whose copy sends nothing for
``stall_timeout`` s (its process stopped with SIGSTOP, a stand-in for a hung server) is
stopped as a cancel stops it (the copy killed, its temporary file removed on the node) and
fails transiently, naming the path it was stuck on."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

distributed = pytest.importorskip("distributed")

from bbstage import config  # noqa: E402
from bbstage.daemon import stall  # noqa: E402
from bbstage.daemon.dask_executor import DaskExecutor  # noqa: E402
from bbstage.movers import Cancelled, TransferError  # noqa: E402
from bbstage.transfer import TransferSpec  # noqa: E402
from tests.helpers import wait_until  # noqa: E402
from tests.unit.test_dask_executor import NOBODY, children, client, partial, sparse  # noqa: E402

__all__ = ["client"]  # the fixture

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the child drops from root to a user")

STALL = 5.0  # a loaded machine's page-cache writeback pauses a copy for seconds


def test_a_stalled_attempt_is_stopped_its_temp_removed_and_the_path_named(
    area: Path, client: Any
) -> None:
    ex = DaskExecutor(config.Movers(executor="dask"), 4, client=client, stall_timeout=STALL)
    stalls = REGISTRY.get_sample_value("bbstage_transfer_stalls_total") or 0.0
    try:
        big, out = sparse(area), area / "out"
        events: list[Any] = []
        future = ex.submit("7:0", TransferSpec.between(str(big), str(out)), NOBODY, events.append)
        wait_until(lambda: partial(area), 60, "the copy's temporary file")
        stopped = children(NOBODY.uid)
        assert stopped, "no child process copies as the user"
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(TransferError) as failed:
            future.result(timeout=STALL + 15)
        assert time.monotonic() - started < STALL + 6
        assert not isinstance(failed.value, Cancelled) and not failed.value.permanent
        assert str(failed.value) == (
            f"stalled: nothing moved for {STALL:g} s (stall_timeout) while copying {big} -> {out}"
        )
        wait_until(lambda: not children(NOBODY.uid), 5, "the stopped copy to be killed")
        wait_until(lambda: sorted(p.name for p in area.iterdir()) == ["big"], 5, "temp removed")
        assert REGISTRY.get_sample_value("bbstage_transfer_stalls_total") == stalls + 1
    finally:
        for pid in children(NOBODY.uid):
            os.kill(pid, signal.SIGKILL)
        ex.shutdown()


@dataclass
class _Watched:
    heard: float | None
    finished: bool = False
    stalled: str = ""


def test_the_watchdog_stops_only_attempts_silent_for_the_timeout() -> None:
    """Heard of lately, not started yet (waiting in Dask for a worker's resource), ended,
    already stopped: left alone. Silent for the timeout: stopped, once."""
    now = time.monotonic()
    silent = _Watched(now - 10)
    attempts = [_Watched(now), _Watched(None), _Watched(now - 10, finished=True),
                _Watched(now - 10, stalled="stalled: before"), silent]  # fmt: skip
    stopped: list[Any] = []

    def stop(attempt: Any) -> None:
        stopped.append(attempt)
        attempt.stalled = "stalled"

    dog = stall.Watchdog(2.0, lambda: attempts, stop)
    dog.start()
    try:
        time.sleep(1.5)
    finally:
        dog.close()
    assert stopped == [silent]
