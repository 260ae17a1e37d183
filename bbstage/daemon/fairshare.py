"""Which waiting transfer runs next: per-user queues shared fairly among the users who wait.

``Policy`` is the rule, pure (no threads, no clock, no I/O): transfers are ``add``-ed to
their user's queue, ``pick`` says which to start now, ``release`` frees a slot. Both
executors (``executor.py``, ``dask_executor.py``) put it behind a ``Queue``, which holds the
transfers' arguments and starts the picked ones.

The rule (``fair``; docs/operations.md "Fair share"):

* ``slots`` transfers run at once. When several users wait, the next free slot goes to the
  waiting user with the fewest running transfers for their weight (``running / weight``;
  ties: the user whose next transfer arrived first). So each user's share is equal (or
  weighted) when several wait, and a lone user may use every slot.
* A user with nothing running is started even when every slot is taken, up to ``2 × slots``
  transfers in all: a user whose transfers hold every slot and never end (a hung server, a
  stopped process) cannot keep another user waiting for a slot to free. Slots beyond
  ``slots`` go only to such users; the next slot freed goes to the users under their share.
* Within one user's queue, the transfer with the smallest ``order`` goes first (the engine
  passes the job's expected start time and priority when Slurm gives them), then the
  earliest arrival.

``fifo`` is the former rule, one queue in arrival order for all users: kept to compare
(``benchmarks/bench_fairness.py``) and as an admin's way back.
"""

from __future__ import annotations

import heapq
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

FAIR, FIFO = "fair", "fifo"
POLICIES = (FAIR, FIFO)

T = TypeVar("T")


@dataclass(frozen=True, order=True)
class _Entry:
    order: tuple[Any, ...]
    seq: int
    key: str = field(compare=False)
    user: int = field(compare=False)


class Policy:
    """The queues and running counts of every user (``user``: a uid)."""

    def __init__(
        self, slots: int, weights: Mapping[int, float] | None = None, mode: str = FAIR
    ) -> None:
        if mode not in POLICIES:
            raise ValueError(f"unknown scheduling policy {mode!r}: {' or '.join(POLICIES)}")
        self.slots = max(1, slots)
        self.mode = mode
        self.cap = self.slots if mode == FIFO else 2 * self.slots  # running at most
        self._weights = dict(weights or {})
        self._lanes: dict[int, list[_Entry]] = {}  # a heap per user (one for all in fifo)
        self._waiting: dict[str, _Entry] = {}
        self._running: dict[str, int] = {}  # key → user
        self._per_user: Counter[int] = Counter()  # running transfers by user
        self._seq = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def weight(self, user: int) -> float:
        return self._weights.get(user, 1.0)

    def add(self, key: str, user: int, order: tuple[Any, ...] = ()) -> None:
        """Queue a transfer (``key`` not already queued or running)."""
        if key in self._waiting or key in self._running:
            raise ValueError(f"transfer {key} is already queued or running")
        self._seq += 1
        entry = _Entry(() if self.mode == FIFO else order, self._seq, key, user)
        self._waiting[key] = entry
        heapq.heappush(self._lanes.setdefault(self._lane(user), []), entry)

    def remove(self, key: str) -> bool:
        """Take a waiting transfer out of its queue (cancelled); False if it is not waiting."""
        entry = self._waiting.pop(key, None)
        if entry is None:
            return False
        lane = self._lane(entry.user)
        heap = self._lanes[lane]
        heap.remove(entry)
        heapq.heapify(heap)
        if not heap:
            del self._lanes[lane]
        return True

    def pick(self) -> list[str]:
        """The transfers to start now, counted as running from now on."""
        started = []
        while (lane := self._next_lane()) is not None:
            entry = heapq.heappop(self._lanes[lane])
            if not self._lanes[lane]:
                del self._lanes[lane]
            del self._waiting[entry.key]
            self._running[entry.key] = entry.user
            self._per_user[entry.user] += 1
            started.append(entry.key)
        return started

    def release(self, key: str) -> None:
        """A running transfer ended: its slot is free (``pick`` fills it)."""
        user = self._running.pop(key, None)
        if user is not None:
            self._per_user[user] -= 1
            if not self._per_user[user]:
                del self._per_user[user]

    def _lane(self, user: int) -> int:
        return 0 if self.mode == FIFO else user

    def _next_lane(self) -> int | None:
        """The queue whose head starts next, or None if none may start now."""
        total = len(self._running)
        if not self._lanes or total >= self.cap:
            return None
        if self.mode == FIFO:
            return 0 if total < self.slots else None
        lanes = list(self._lanes)
        if total >= self.slots:  # every slot taken: only a user with nothing running
            lanes = [u for u in lanes if not self._per_user[u]]
        if not lanes:
            return None
        return min(lanes, key=lambda u: (self._per_user[u] / self.weight(u), self._lanes[u][0]))

    def users(self) -> dict[int, tuple[int, int]]:
        """Each user with transfers queued or running: (queued, running)."""
        queued = Counter(e.user for e in self._waiting.values())
        return {
            u: (queued[u], self._per_user[u]) for u in sorted(set(queued) | set(self._per_user))
        }

    def reason(self, key: str) -> str | None:
        """Why a transfer waits, in words for its owner; None if it does not wait."""
        entry = self._waiting.get(key)
        if entry is None:
            return None
        users = len(self.users())
        share = f"{users} user{'s' if users != 1 else ''} share {self.slots} slots"
        if self.mode == FIFO:
            ahead = sum(1 for e in self._waiting.values() if e.seq < entry.seq)
            return f"queued: {ahead} transfers ahead (first come, first served); {share}"
        ahead = sum(1 for e in self._lanes[entry.user] if e < entry)
        running = self._per_user[entry.user]
        return f"queued: {ahead} of your transfers ahead, {running} running; {share}"


class Queued:
    """What an executor answers from its ``Queue`` (``_queue``): the members of
    ``contracts.Executor`` both executors share, documented there."""

    _queue: Queue[Any]

    @property
    def queued(self) -> int:
        return self._queue.waiting

    def why(self, key: str) -> str | None:
        return self._queue.reason(key)

    def users(self) -> dict[int, tuple[int, int]]:
        return self._queue.users()

    def hold(self) -> None:
        self._queue.hold()


class Queue(Generic[T]):
    """A ``Policy`` made thread-safe, holding each waiting transfer's ``item`` (what its
    executor needs to run it) and handing the picked ones to ``start``, outside the lock."""

    def __init__(self, policy: Policy, start: Callable[[str, T], None]) -> None:
        self.policy = policy
        self._start = start
        self._items: dict[str, T] = {}
        self._lock = threading.Lock()
        self._held = False

    def hold(self) -> None:
        """Start no more transfers: those waiting stay queued (a drain before an upgrade)."""
        with self._lock:
            self._held = True

    def add(self, key: str, user: int, order: tuple[Any, ...], item: T) -> None:
        with self._lock:
            self.policy.add(key, user, order)
            self._items[key] = item
        self._dispatch()

    def release(self, key: str) -> None:
        """A started transfer ended (whatever its outcome): start the next ones."""
        with self._lock:
            self.policy.release(key)
        self._dispatch()

    def withdraw(self, key: str) -> T | None:
        """Take out a transfer that still waits (cancelled): its item, or None."""
        with self._lock:
            return self._items.pop(key) if self.policy.remove(key) else None

    def drain(self) -> list[T]:
        """Take out every waiting transfer (shutdown)."""
        with self._lock:
            keys = [k for k in self._items if self.policy.remove(k)]
            return [self._items.pop(k) for k in keys]

    def reason(self, key: str) -> str | None:
        with self._lock:
            return self.policy.reason(key)

    def users(self) -> dict[int, tuple[int, int]]:
        with self._lock:
            return self.policy.users()

    @property
    def waiting(self) -> int:
        return self.policy.waiting

    def _dispatch(self) -> None:
        with self._lock:
            if self._held:
                return
            picked = [(k, self._items.pop(k)) for k in self.policy.pick()]
        for key, item in picked:
            self._start(key, item)
