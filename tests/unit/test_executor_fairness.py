"""The executor under several users, with real worker processes: a user whose copies stall
(SIGSTOP, the stand-in for a hung server) delays nobody else; the watchdog stops them."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from bbstage.daemon.executor import TransferExecutor
from bbstage.identity import Identity
from bbstage.movers import Cancelled, TransferError
from bbstage.transfer import Done, TransferSpec
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="workers drop from root to a user")

HEAVY = Identity(65534, 65534, (65534,))  # nobody
LIGHT = Identity(1, 1, (1,))  # daemon


def sparse(area: Path, name: str = "big", size: int = 8 << 30) -> Path:
    """A file that takes seconds to copy and no disk to hold."""
    path = area / name
    with open(path, "wb") as f:
        f.truncate(size)
    path.chmod(0o644)
    return path


def parts(area: Path) -> list[Path]:
    return [p for p in area.iterdir() if p.name.endswith(".part")]


def submit(ex: TransferExecutor, key: str, src: Path, dst: Path, who: Identity) -> Future[Done]:
    return ex.submit(key, TransferSpec.between(str(src), str(dst)), who, lambda event: None)


def stop_running(ex: TransferExecutor, n: int, area: Path) -> list[int]:
    """Once ``n`` transfers write their temporary files, SIGSTOP their workers."""
    wait_until(lambda: len(parts(area)) >= n and ex.running >= n, 60, f"{n} copies under way")
    pids = [w.proc.pid for w in list(ex._running.values())]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


@pytest.fixture
def stopped() -> Iterator[list[int]]:
    """Pids a test SIGSTOPped: continued at its end whatever happened (then killed by the
    executor's shutdown, or already gone)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_a_stalled_user_does_not_keep_another_users_small_transfer_waiting(
    area: Path, stopped: list[int]
) -> None:
    """4 slots, A's 6 copies: 4 run and are stopped for good, 2 wait. B's small transfer
    starts at once (a user with nothing running is admitted beyond the slots) and is in
    place within a second or two, long before any watchdog (60 s here) could fire."""
    ex = TransferExecutor(4, stall_timeout=60)
    try:
        big = sparse(area)
        heavy = [submit(ex, f"1:{i}", big, area / f"a{i}", HEAVY) for i in range(6)]
        stopped += stop_running(ex, 4, area)
        assert ex.queued == 2
        data = os.urandom(1 << 20)
        small = area / "small"
        small.write_bytes(data)
        small.chmod(0o644)
        asked = time.monotonic()
        done = submit(ex, "2:0", small, area / "b", LIGHT).result(timeout=30)
        took = time.monotonic() - asked
        assert done.bytes == len(data)
        digest = hashlib.sha256((area / "b").read_bytes()).hexdigest()
        assert digest == hashlib.sha256(data).hexdigest()
        assert took < 3, f"B's 1 MiB transfer took {took:.1f} s behind A's stalled copies"
        assert not any(f.done() for f in heavy)
    finally:
        ex.shutdown()


def test_the_watchdog_stops_a_stalled_transfer_removes_its_temps_and_names_the_path(
    area: Path, stopped: list[int]
) -> None:
    ex = TransferExecutor(4, stall_timeout=1.0)
    stalls = REGISTRY.get_sample_value("bbstage_transfer_stalls_total") or 0.0
    try:
        big = sparse(area)
        future = submit(ex, "1:0", big, area / "out", HEAVY)
        stopped += stop_running(ex, 1, area)
        with pytest.raises(TransferError) as caught:
            future.result(timeout=20)
        assert not caught.value.permanent  # transient: the engine tries again
        assert "stalled: nothing moved for 1 s" in str(caught.value)
        assert f"{big} -> {area / 'out'}" in str(caught.value)
        assert sorted(p.name for p in area.iterdir()) == ["big"]  # the .part is gone
        assert ex.running == 0
        assert REGISTRY.get_sample_value("bbstage_transfer_stalls_total") == stalls + 1
    finally:
        ex.shutdown()


def test_a_waiting_transfer_says_why_and_leaves_its_queue_when_cancelled(
    area: Path, stopped: list[int]
) -> None:
    ex = TransferExecutor(1, stall_timeout=60)
    try:
        big = sparse(area)
        submit(ex, "1:0", big, area / "a0", HEAVY)
        waiting = submit(ex, "1:1", big, area / "a1", HEAVY)
        stopped += stop_running(ex, 1, area)
        assert ex.why("1:0") is None
        assert ex.why("1:1") == "queued: 0 of your transfers ahead, 1 running; 1 user share 1 slots"
        assert ex.users() == {HEAVY.uid: (1, 1)}
        ex.cancel("1:1")
        with pytest.raises(Cancelled):
            waiting.result(timeout=1)
        assert ex.queued == 0
    finally:
        ex.shutdown()
