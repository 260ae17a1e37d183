"""How many bytes of whole objects one transfer holds in memory at once.

Small objects move whole (a GET's body, a file read for one PUT), and many move at once
(``files_in_flight``): more in flight costs the store less CPU per object, but each may be
up to ``fast.FAST_MAX``. A ``ByteBudget`` keeps what they hold under ``HELD`` bytes
whatever their count, so ``files_in_flight`` buys speed without buying memory.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

from bbstage.movers.implementations.s3.settings import MiB

HELD = 256 * MiB  # whole objects in memory at once, per transfer


class ByteBudget:
    """At most ``limit`` bytes held at once, granted in the order asked (a big request is
    not starved by small ones behind it); a request above ``limit`` waits until nothing
    else is held. For one event loop."""

    def __init__(self, limit: int) -> None:
        self._limit, self._held = limit, 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def held(self) -> int:
        return self._held

    @contextlib.asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        """Hold ``n`` bytes while the block runs."""
        n = min(n, self._limit)
        if self._waiting or self._held + n > self._limit:
            granted = asyncio.get_running_loop().create_future()
            self._waiting.append((n, granted))
            try:
                await granted
            except BaseException:
                if granted.done() and not granted.cancelled():  # granted, then cancelled
                    self._release(n)
                else:
                    granted.cancel()
                    self._grant()  # it may have kept smaller ones behind it waiting
                raise
        else:
            self._held += n
        try:
            yield
        finally:
            self._release(n)

    def _release(self, n: int) -> None:
        self._held -= n
        self._grant()

    def _grant(self) -> None:
        while self._waiting:
            n, granted = self._waiting[0]
            if not granted.cancelled():
                if self._held + n > self._limit:
                    return
                self._held += n
                granted.set_result(None)
            self._waiting.popleft()
