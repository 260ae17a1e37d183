"""Sizes and counts from untrusted sources, checked where they enter (audit #12).

An S3 endpoint may be the user's own (``~/.aws/config``), and its listing ``Size``, its
``Content-Length`` are any text; sparse files make sizes that add up past what SQLite
stores (``2**63 - 1``: beyond it ``sqlite3`` raises ``OverflowError``, and the daemon's
progress recorder would die with it). So a size read from a server is taken only as ASCII
digits within ``0 .. MAX`` (``size``), a sum is checked as it grows (``total``), and the
engine keeps what an executor reports within range (``clamp``: the Dask executor sums its
shards' counts in root).
"""

from __future__ import annotations

from typing import Any

from bbstage.movers.base import TransferError

MAX = (1 << 63) - 1  # the largest integer SQLite stores


def size(value: Any, what: str) -> int:
    """``value`` (an int, or the text a server sent) as a size in ``0 .. MAX``, or a
    TransferError (permanent) naming ``what`` and the value (cut to 40 characters)."""
    if type(value) is int:
        number: int | None = value
    elif isinstance(value, str | bytes) and value.strip().isascii() and value.strip().isdigit():
        number = int(value.strip())
    else:
        number = None
    if number is None or not 0 <= number <= MAX:
        shown = repr(value)[:40]
        raise TransferError(
            f"{what}: the server gave its size as {shown}, not a size in 0 .. 2**63-1"
        )
    return number


def total(count: int, what: str) -> int:
    """``count`` (a sum of sizes) if it is at most ``MAX``; else a TransferError naming ``what``."""
    if not 0 <= count <= MAX:
        raise TransferError(
            f"the files planned add up to {count} bytes at {what}, over 2**63-1"
            " (sparse files of a huge apparent size?): not staged"
        )
    return count


def clamp(count: int) -> int:
    """``count`` within ``0 .. MAX`` (for progress counts: a recorder must not die of one)."""
    return min(max(count, 0), MAX)
