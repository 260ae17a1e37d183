"""The page cache and the disks between timed copies, so that no copy pays for the one
before it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bbstage.bench.model import BenchError

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def can_drop_caches() -> bool:
    return os.geteuid() == 0 and os.access(DROP_CACHES, os.W_OK)


def cache_policy(asked: str) -> str:
    """``drop`` or ``warm``: what ``auto`` means here; a BenchError for a ``drop`` we cannot do."""
    if asked == "auto":
        return "drop" if can_drop_caches() else "warm"
    if asked == "drop" and not can_drop_caches():
        raise BenchError(f"cannot drop caches: {DROP_CACHES} is not writable (run as root)")
    return asked


def settle(cache: str) -> None:
    """Before a timed copy: flush dirty data; drop the page cache when asked; then wait
    for the disks to go idle (a removed destination's discards, the journal), so that no
    copy pays for the one before it."""
    os.sync()
    if cache == "drop":
        DROP_CACHES.write_text("3\n")
    wait_for_idle_disks()


def wait_for_idle_disks(quiet: float = 0.3, limit: float = 10.0) -> None:
    """Return once no block device has done any I/O for ``quiet`` seconds (or after ``limit``).
    Uses the busy-time counters of /proc/diskstats; returns at once where it is unreadable."""

    def busy() -> str | None:
        try:
            with open("/proc/diskstats") as f:
                return " ".join(line.split()[12] for line in f if len(line.split()) > 12)
        except OSError:
            return None

    deadline = time.monotonic() + limit
    last = busy()
    while last is not None and time.monotonic() < deadline:
        time.sleep(quiet)
        now = busy()
        if now == last:
            return
        last = now
