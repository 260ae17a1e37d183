"""structlog set-up: one JSON object per line, with job id, hook and directive bound."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import structlog


def configure(level: str = "info", *, cache: bool = True) -> None:
    """JSON lines on stderr from ``level`` up (the daemon's logs). ``cache``: bind each
    logger once, at its first use (fast; for good)."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=cache,
    )


@contextmanager
def quiet(level: str = "warning") -> Iterator[None]:
    """For the block, only ``level`` and up, on stderr; then the set-up as it was (a
    command whose stdout is its result, maybe called in a process that logs otherwise)."""
    before = structlog.get_config()
    configure(level, cache=False)
    try:
        yield
    finally:
        structlog.configure(**before)
