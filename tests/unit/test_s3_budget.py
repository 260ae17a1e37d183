"""``s3/budget.py``: never more than the limit held, granted in the order asked, a request
above the limit alone, and a cancelled request neither kept nor leaked. The movers' use of
it (many small objects up and down): tests/unit/test_s3_mover.py."""

from __future__ import annotations

import asyncio

import pytest

from bbstage.movers.implementations.s3.budget import ByteBudget


async def _holder(budget: ByteBudget, n: int, log: list[str], name: str, wait: float) -> None:
    async with budget.hold(n):
        log.append(f"+{name}")
        assert budget.held <= 100
        await asyncio.sleep(wait)
        log.append(f"-{name}")


def test_never_more_than_the_limit_yet_as_many_as_fit() -> None:
    peak = 0

    async def main() -> None:
        nonlocal peak
        budget = ByteBudget(100)

        async def one(n: int) -> None:
            nonlocal peak
            async with budget.hold(n):
                peak = max(peak, budget.held)
                await asyncio.sleep(0.01)

        await asyncio.gather(*(one(n) for n in [30, 30, 30, 30, 10, 40, 60, 20] * 5))
        assert budget.held == 0

    asyncio.run(main())
    assert 60 < peak <= 100  # several at once, never above the limit


def _in_turn(*asks: tuple[str, int, float]) -> list[str]:
    """Holders of (name, bytes, seconds) asking one after another on a budget of 100:
    when each got its bytes (+name) and gave them back (-name)."""
    log: list[str] = []

    async def main() -> None:
        budget = ByteBudget(100)
        holders = []
        for name, n, wait in asks:
            holders.append(asyncio.ensure_future(_holder(budget, n, log, name, wait)))
            await asyncio.sleep(0)  # it has asked before the next one does
        await asyncio.gather(*holders)

    asyncio.run(asyncio.wait_for(main(), 5))
    return log


def test_granted_in_the_order_asked_so_a_big_request_is_not_starved() -> None:
    # 30 would fit beside a's 60, but big asked first: it waits behind big.
    log = _in_turn(("a", 60, 0.05), ("big", 80, 0.01), ("small", 30, 0.01))
    assert log.index("+big") < log.index("+small")
    assert log.index("-a") < log.index("+big")


def test_a_release_grants_in_order_too() -> None:
    """c's 30 back leaves 60 held: big (80) still does not fit, and small (10) behind it,
    which would, waits for big."""
    log = _in_turn(("a", 60, 0.08), ("c", 30, 0.01), ("big", 80, 0.01), ("small", 10, 0.01))
    assert log.index("-c") < log.index("-a") < log.index("+big") < log.index("+small")


def test_bytes_are_given_back_when_the_block_fails() -> None:
    async def main() -> None:
        budget = ByteBudget(100)
        with pytest.raises(OSError):
            async with budget.hold(70):
                raise OSError("disk full")
        assert budget.held == 0
        async with budget.hold(100):
            assert budget.held == 100

    asyncio.run(asyncio.wait_for(main(), 5))


def test_a_request_above_the_limit_runs_alone() -> None:
    log = _in_turn(("a", 50, 0.03), ("huge", 500, 0.02), ("b", 10, 0.01))
    assert log == ["+a", "-a", "+huge", "-huge", "+b", "-b"]


@pytest.mark.parametrize("when", ["waiting", "granted"])
def test_a_cancelled_request_neither_blocks_others_nor_keeps_its_bytes(when: str) -> None:
    """Cancelled while it waits, or after it was granted but before it ran."""

    async def main() -> None:
        budget = ByteBudget(100)
        log: list[str] = []
        async with budget.hold(70):
            gone = asyncio.ensure_future(_holder(budget, 90, log, "gone", 1))
            await asyncio.sleep(0)
            small = asyncio.ensure_future(_holder(budget, 20, log, "small", 0.01))
            await asyncio.sleep(0)
            if when == "waiting":
                gone.cancel()
                await asyncio.sleep(0.05)
                assert log == ["+small", "-small"]  # beside the 70, no longer behind 90
        if when == "granted":
            assert budget.held == 90  # granted by that release; it has not run yet
            gone.cancel()
        await small
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert "+gone" not in log and budget.held == 0

    asyncio.run(asyncio.wait_for(main(), 5))
