"""Where the files a site installs beside the code are: the Slurm hooks (``lua``) and the
systemd unit, example config, alert rules and dashboard (``daemon``).

The repository keeps them at its top, as the design fixes; a wheel or sdist build copies
them into the package as ``bbstage/share/<name>`` (``setup.py``). So an installed bbstage
finds them inside itself, and a checkout (run in place or installed editable) at its top.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """The directory of shipped files ``name`` ("lua" or "daemon"): the installed copy, else
    the checkout's. It may not exist (a broken install): callers name it in their error."""
    installed = _PACKAGE / "share" / name
    return installed if installed.is_dir() else _PACKAGE.parent / name
