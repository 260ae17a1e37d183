"""Transient failures retried with capped exponential backoff (the worker's and its walk's)."""

from __future__ import annotations

import threading
from typing import Any

from bbstage import movers
from bbstage.movers import TransferError

RETRIES = 5
BACKOFF_CAP = 8.0  # seconds: the longest wait between two attempts


def with_retries(action: Any, cancel: threading.Event) -> Any:
    """Run ``action``; retry transient errors with capped exponential backoff."""
    delay = 0.2
    for attempt in range(RETRIES + 1):
        try:
            return action()
        except (TransferError, OSError) as exc:
            err = exc if isinstance(exc, TransferError) else movers.base.os_error(exc)
            if err.permanent or attempt == RETRIES or cancel.is_set():
                raise err from None
        if cancel.wait(delay):
            raise movers.Cancelled()
        delay = min(delay * 2, BACKOFF_CAP)
    raise AssertionError("unreachable")
