"""One side of a generic transfer (``Side``: its backend and its filesystems) and a store
entry's modification time (``mtime_ns``)."""

from __future__ import annotations

import datetime as dt
import os
import stat
import threading
from typing import Any

from bbstage.movers import backend as backend_of
from bbstage.movers.base import BackendOptions, TransferError, os_error
from bbstage.movers.implementations.generic.errors import translate


def mtime_ns(info: dict[str, Any]) -> int | None:
    """A store entry's modification time (the keys differ by store)."""
    for key in ("mtime", "last_modified", "updated", "LastModified", "modified", "timeCreated"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, dt.datetime):
            stamp = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
            return int(stamp.timestamp() * 1e9)
        if isinstance(value, int | float):
            return int(value * 1e9)
        if isinstance(value, str):
            try:
                parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            return int(
                (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)).timestamp() * 1e9
            )
    return None


class Side:
    """One side of a transfer: its backend, and its filesystem (made at first use, in the
    worker, as the user; per URL authority for stores whose host is in the URL)."""

    def __init__(self, kind: str, options: BackendOptions | None) -> None:
        self.backend = backend_of(kind)
        self.options = options
        self.local = self.backend.local
        self._fs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def fs(self, url: str) -> Any:
        authority = url.split("://", 1)[1].split("/", 1)[0] if "://" in url else ""
        with self._lock:
            if authority not in self._fs:
                try:
                    self._fs[authority] = self.backend.filesystem(self.options, url)
                except TransferError:
                    raise
                except Exception as exc:
                    raise translate(exc, url) from None
            return self._fs[authority]

    def close(self) -> None:
        """The transfer has ended: each filesystem's backend stops what it still does."""
        with self._lock:
            made = list(self._fs.values())
        for fs in made:
            self.backend.close(fs)

    def path(self, url: str) -> str:
        return url if self.local else self.backend.strip(url)

    def info(self, url: str) -> dict[str, Any] | None:
        """The entry at ``url``, or None if there is none."""
        if self.local:
            try:
                st = os.stat(url)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise os_error(exc, url) from None
            kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
            return {"type": kind, "size": st.st_size, "mtime": st.st_mtime_ns / 1e9}
        try:
            return dict(self.fs(url).info(self.path(url)))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise translate(exc, url) from None
