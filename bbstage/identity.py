"""Who a transfer runs as: the job owner's uid, gid and supplementary groups, never root;
the environment a process started for them gets, and the one way root removes files as them.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from collections.abc import Sequence
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


# Run as the owner: unlink each NUL-separated path read from stdin. No bbstage import: the
# interpreter starts with -I -S, so it needs no access to the install (nor a PYTHONPATH).
_UNLINK = (
    "import os, sys\n"
    "for p in sys.stdin.buffer.read().split(b'\\0'):\n"
    "    try:\n"
    "        p and os.unlink(p)\n"
    "    except OSError:\n"
    "        pass\n"
)


def unlink_as(identity: Identity, paths: Sequence[str], timeout: float = 60.0) -> None:
    """Remove ``paths`` as ``identity``, in a process the kernel starts as that user (root
    must not unlink in directories the user controls: a path swapped for a link would make
    root remove what the user could not). A path already gone, or not the user's to remove,
    stays as it is. The one way root removes files as a user: the executor's for a killed
    worker, the Dask task's for a failed child, and the leftover sweep's. Raises ``OSError``
    or ``subprocess.SubprocessError`` if the process could not run or did not end well."""
    if not paths:
        return
    subprocess.run(
        [sys.executable, "-I", "-S", "-c", _UNLINK],
        input=b"\0".join(os.fsencode(p) for p in paths),
        user=identity.uid,
        group=identity.gid,
        extra_groups=list(identity.groups),
        umask=0o077,
        env=user_env(identity.uid),
        cwd="/",
        timeout=timeout,
        check=True,
    )
