"""What a client (``bbstage status``, ``copy``, ``bbstage.api``) reads of the config file:
where the daemon listens. Read alone, by the rules of ``bbstage.kinds`` (the daemon's own),
so a login or compute node with the site's file needs none of the daemon's own files (a CA
bundle, pools, credentials) nor its libraries (msgspec: a job step's Python may have only
the client's)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bbstage.kinds import Address, ConfigError, FilePath

DEFAULT_PATH = Path("/etc/bbstage/bbstage.toml")

__all__ = ["DEFAULT_PATH", "ClientSettings", "ConfigError", "load_client", "read"]


def read(path: Path | str) -> dict[str, Any]:
    """The file's tables as tomllib reads them; a missing file is an empty one."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text()) if path.exists() else {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None


@dataclass(frozen=True)
class ClientSettings:
    """The ``[daemon]`` keys a client needs (their defaults are the daemon's)."""

    user_socket: Path = Path("/run/bbstage/user.sock")
    api_address: str = ""  # host:port of the munge-authenticated network API; "" = off
    munge_socket: Path = Path("/run/munge/munge.socket.2")  # munged that checks API requests


_CLIENT_KEYS = {"user_socket": FilePath, "api_address": Address, "munge_socket": FilePath}


def load_client(path: Path | str = DEFAULT_PATH) -> ClientSettings:
    """The ``[daemon]`` keys a client needs, checked as the daemon checks them; the rest of
    the file is not read (a missing file means the defaults)."""
    daemon = read(path).get("daemon", {})
    if not isinstance(daemon, dict):
        raise ConfigError(f"{path}: [daemon]: expected a table")
    kwargs: dict[str, Any] = {}
    for key, kind in _CLIENT_KEYS.items():
        if key in daemon:
            try:
                kwargs[key] = kind.of(daemon[key])
            except ValueError as exc:
                raise ConfigError(f"{path}: [daemon] {key}: {exc}") from None
    return ClientSettings(**kwargs)
