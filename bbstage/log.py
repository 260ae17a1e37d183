"""structlog set-up: one JSON object per line, with job id, hook and directive bound.

Under systemd, when stderr is the journal, each line starts with its syslog priority
(``<3>`` error, ``<4>`` warning, ``<6>`` info, ``<7>`` debug: sd-daemon(3)). journald
(``SyslogLevelPrefix=yes``, its default) takes the prefix off and files the line at that
priority, so ``journalctl -u bbstage -p warning`` shows warnings and errors only, and
``journalctl -u bbstage -o cat`` shows the bare JSON. The prefix is written only when
``$JOURNAL_STREAM`` names stderr's device and inode (systemd sets it for a service whose
stderr it connects to the journal; a terminal, a file or a pipe get plain JSON).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import structlog

# sd-daemon(3)'s prefixes, by structlog's level names ("exception" is logged as "error").
PRIORITY = {"critical": 2, "error": 3, "exception": 3, "warning": 4, "warn": 4,
            "notice": 5, "info": 6, "debug": 7}  # fmt: skip


def journal_stream(stream: TextIO | None = None, env: dict[str, str] | None = None) -> bool:
    """Whether ``stream`` (stderr) is connected to the journal: ``$JOURNAL_STREAM`` is
    ``DEVICE:INODE`` of it (systemd.exec(5)). Not enough that the variable is set: a child
    of the service whose stderr was redirected inherits it."""
    value = (os.environ if env is None else env).get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat((sys.stderr if stream is None else stream).fileno())
    except (OSError, ValueError, AttributeError):  # closed, or no descriptor (a test's)
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


class JournalPrefix:
    """The last processor: ``<N>`` before the rendered line, N its level's priority."""

    def __init__(self, renderer: Any) -> None:
        self.renderer = renderer

    def __call__(self, logger: Any, method: str, event_dict: dict[str, Any]) -> str:
        level = str(event_dict.get("level", method))
        line = self.renderer(logger, method, event_dict)
        return f"<{PRIORITY.get(level, 6)}>{line}"


def configure(level: str = "info", *, cache: bool = True, journal: bool | None = None) -> None:
    """JSON lines on stderr from ``level`` up (the daemon's logs). ``cache``: bind each
    logger once, at its first use (fast; for good). ``journal``: prefix each line with its
    priority; None: when stderr is the journal (``journal_stream``)."""
    if journal is None:
        journal = journal_stream()
    renderer: Any = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            JournalPrefix(renderer) if journal else renderer,
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
