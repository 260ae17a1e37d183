"""bbstage: data staging for Slurm's burst_buffer/lua plugin."""

import os
import sys

__version__ = "0.3.0.dev0"  # PEP 440; each release is tagged v<version> (docs/releasing.md)


def where() -> str:
    """Which bbstage this is, for ``--version`` and the daemon's first log line: an admin
    (and the wheel-install tests) can tell a site install from a checkout's."""
    python = ".".join(map(str, sys.version_info[:3]))
    return f"{os.path.dirname(os.path.abspath(__file__))} (Python {python})"
