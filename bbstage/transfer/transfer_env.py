"""A transfer's environment: an allow-list, never root's.

A worker (or a Dask child) starts from ``identity.user_env`` (PATH, the user's HOME, the
locale). The only variables of the daemon's environment it may see are those a backend
asks for by name (``Backend.env``: proxies), and each transfer sees only those of its own two
backends: a posix to posix transfer sees none, and no backend's credentials (AWS_*,
GOOGLE_APPLICATION_CREDENTIALS, AZURE_*...) ever reach a user's process unless a backend
names them.
"""

from __future__ import annotations

import os

from bbstage import movers
from bbstage.identity import user_env

_passable: dict[str, str] = {}  # what some backend may let through, read before the switch


def remember() -> None:
    """Keep, from this process's environment, the values of the variables some backend
    lets its workers see, before ``apply`` replaces the environment."""
    names = movers.env_names(movers.known_implementations)
    _passable.clear()
    _passable.update({k: v for k, v in os.environ.items() if k in names})


def apply(*kinds: str) -> None:
    """Make this process's environment the user's plus what the backends of ``kinds`` let
    through (called before each transfer, as the user)."""
    wanted = movers.env_names(set(kinds))
    os.environ.clear()
    os.environ.update(user_env(os.getuid()))
    os.environ.update({k: v for k, v in _passable.items() if k in wanted})
