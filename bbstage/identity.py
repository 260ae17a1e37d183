"""Who a transfer runs as: the job owner's uid, gid and supplementary groups, never root."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass


class IdentityError(PermissionError):
    """The job owner cannot be resolved or is not allowed to stage."""


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def of(cls, uid: int, gid: int) -> Identity:
        """Resolve supplementary groups from the user database, as a login would."""
        if uid == 0:
            raise IdentityError("bbstage never stages data for root")
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            raise IdentityError(f"uid {uid} is not known to this host's user database") from None
        return cls(uid, gid, tuple(sorted(set(os.getgrouplist(name, gid)))))

    def assume(self) -> None:
        """Drop every privilege for good (call in a worker process before touching data)."""
        os.setgroups(list(self.groups))
        os.setresgid(self.gid, self.gid, self.gid)
        os.setresuid(self.uid, self.uid, self.uid)
        if os.getuid() != self.uid or os.geteuid() != self.uid:  # pragma: no cover - paranoia
            raise IdentityError("could not drop privileges")
        os.umask(0o077)
