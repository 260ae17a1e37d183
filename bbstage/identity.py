"""Who a transfer runs as: the job owner's uid, gid and supplementary groups, never root."""

from __future__ import annotations

import os
import pwd
import time
from dataclasses import dataclass

CACHE_SECONDS = 60.0  # how long a resolved identity is reused, as nscd would
_cache: dict[tuple[int, int], tuple[float, Identity]] = {}


class IdentityError(PermissionError):
    """The job owner cannot be resolved or is not allowed to stage."""


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def of(cls, uid: int, gid: int) -> Identity:
        """Resolve supplementary groups from the user database, as a login would (reused
        for ``CACHE_SECONDS``: a job array asks for the same owner hundreds of times)."""
        if uid == 0:
            raise IdentityError("bbstage never stages data for root")
        now = time.monotonic()
        hit = _cache.get((uid, gid))
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1]
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            raise IdentityError(f"uid {uid} is not known to this host's user database") from None
        identity = cls(uid, gid, tuple(sorted(set(os.getgrouplist(name, gid)))))
        if len(_cache) > 4096:
            _cache.clear()
        _cache[(uid, gid)] = (now, identity)
        return identity

    def assume(self) -> None:
        """Drop every privilege for good (call in a worker process before touching data)."""
        os.setgroups(list(self.groups))
        os.setresgid(self.gid, self.gid, self.gid)
        os.setresuid(self.uid, self.uid, self.uid)
        if os.getuid() != self.uid or os.geteuid() != self.uid:  # pragma: no cover - paranoia
            raise IdentityError("could not drop privileges")
        os.umask(0o077)


USER_PATH = "/usr/bin:/bin"
_KEPT = ("LANG", "TZ")  # and every LC_*: how the user's process reads and shows text and time


def user_env(uid: int, **extra: str) -> dict[str, str]:
    """The whole environment of a process started for the user ``uid``: an allow-list,
    never root's environment (its keys, proxies and whatever systemd's ``Environment=``
    holds would be readable in ``/proc/<pid>/environ`` by that user). ``PATH``, the user's
    ``HOME``, the locale and time zone, and ``extra``."""
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        home = "/"
    env = {"PATH": USER_PATH, "HOME": home, "LANG": "C.UTF-8"}
    env |= {k: v for k, v in os.environ.items() if k in _KEPT or k.startswith("LC_")}
    return env | extra
