"""The one retry policy: what is tried again after a transient failure, how often, how soon.

A transient failure (``TransferError(permanent=False)``, or an ``OSError`` that
``movers.base.os_error`` calls transient: a reset connection, a timeout, a 5xx) is tried
again at three layers, each with its own ``RetryPolicy`` below, and nowhere else:

* ``TRANSFER``: the engine runs a failed transfer again as a new attempt (a killed worker,
  a lost transfer node, a file layer that gave up), resuming: what is in place is skipped.
* ``FILE``: the worker tries each step again (the plan, a directory, a file, a batch of
  files, a byte range) with capped exponential backoff.
* ``REQUEST``: a backend that splits a file into requests (S3's parts, pages and ranged
  GETs) tries each request again, quickly, so that one dropped part does not send a big
  file back to the file layer. Its client library does not retry beneath it
  (``LIBRARY_TRIES``: botocore's ``max_attempts`` and obstore's retries follow it).

So one request of a transfer that keeps failing is sent at most ``BUDGET`` times
(``TRANSFER.tries * FILE.tries * REQUEST.tries * LIBRARY_TRIES``: 3 x 6 x 3 x 1 = 54),
over about ``TRANSFER.tries * (FILE.wait() + FILE.tries * REQUEST.wait())`` seconds of
waiting (docs/operations.md, "Retries: one policy, one budget"). A cancel stops every layer at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from bbstage.movers.base import Cancelled, TransferError, os_error

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """``tries`` in all (the first one included), waiting ``first`` seconds after the first
    failure, each wait ``factor`` times the one before, none longer than ``cap``."""

    tries: int
    first: float = 0.0
    factor: float = 2.0
    cap: float = 8.0

    def waits(self) -> Iterator[float]:
        """The waits between tries: ``tries - 1`` of them."""
        delay = self.first
        for _ in range(self.tries - 1):
            yield min(delay, self.cap)
            delay *= self.factor

    def wait(self) -> float:
        """All the waits of one step that fails every time, in seconds."""
        return sum(self.waits())

    def run(self, action: Callable[[], T], cancel: threading.Event) -> T:
        """``action()``, tried again after each transient ``TransferError``/``OSError``
        until it succeeds, fails permanently, runs out of tries or ``cancel`` is set."""
        waits = self.waits()
        while True:
            try:
                return action()
            except (TransferError, OSError) as exc:
                err = exc if isinstance(exc, TransferError) else os_error(exc)
                delay = next(waits, None)
                if err.permanent or delay is None or cancel.is_set():
                    raise err from None
            if cancel.wait(delay):
                raise Cancelled()


TRANSFER = RetryPolicy(tries=3)  # the engine's attempts (it waits for nothing: a new attempt)
FILE = RetryPolicy(tries=6, first=0.2, factor=2.0, cap=8.0)  # the worker's, per step
REQUEST = RetryPolicy(tries=3, first=0.1, factor=4.0, cap=1.6)  # a backend's, per request
LIBRARY_TRIES = 1  # a client library's own, beneath REQUEST: none
BUDGET = TRANSFER.tries * FILE.tries * REQUEST.tries * LIBRARY_TRIES
