"""The contract of a backend: everything bbstage knows about one kind of storage, keyed by
URL scheme (``s3``, ``gs``, ...; local paths are the ``posix`` backend).

A backend is one class (a subclass of ``Backend``) in its module or package under
``implementations/``, listed in the registry (``bbstage.movers.known_implementations``) by
the string ``"module:Class"`` so that nothing is imported before it is used. It owns:

* ``schemes`` and ``url_rule``: which URLs the directive parsers accept for it (the Python
  parser asks the registry; ``bbstage install-lua`` writes the same rules into
  ``bbstage_site.lua`` for the Lua one);
* ``section`` and ``check_settings``: its table of the daemon config (``[s3]``, ``[gs]``);
* ``options``: the typed per-transfer options it needs in the worker (a frozen dataclass,
  a subclass of ``BackendOptions``; ``None`` when it needs none), built by the daemon for
  the side of the transfer that is its own; the other side never sees them;
* ``env``: the names of the daemon's environment variables its workers may see (a
  worker's environment is an allow-list: ``identity.user_env`` plus these, for the
  backends of the transfer at hand);
* ``preload``: modules the executor's forkserver imports once, before it forks workers;
* ``movers``: its fast paths, ``(source scheme, destination scheme) -> "module:Class"``;
  every other pair of enabled backends goes through the generic fsspec mover, reading and
  writing through ``filesystem`` (``bbstage.movers.implementations.generic``);
* its capabilities (``read_only``, ``assembles_pieces``, ``local``, ``ranges``).

No module outside a backend names a scheme (``tests/unit/test_layout.py`` checks it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from bbstage.movers.base import BackendOptions, TransferError


@dataclass(frozen=True)
class UrlRule:
    """The part of ``scheme://authority/path`` a directive parser checks at ``sbatch``:
    ``authority`` (a bucket, a container, a host) has ``low``-``high`` characters of
    ``chars`` (ranges such as ``"a-z"`` or single characters), starting and ending with one
    of ``ends``; ``what`` names it in messages (``S3 bucket``) and ``rules`` says the rule in
    words. ``utf8``: the path must be UTF-8 text (object keys are)."""

    what: str
    rules: str
    chars: tuple[str, ...]
    ends: tuple[str, ...]
    low: int
    high: int
    utf8: bool = True

    def regex(self) -> re.Pattern[str]:
        """The authority rule as a Python regular expression (``fullmatch``)."""

        def cls(items: tuple[str, ...]) -> str:
            return "[" + "".join(i if len(i) == 3 else re.escape(i) for i in items) + "]"

        return re.compile(f"{cls(self.ends)}(?:{cls(self.chars)}*{cls(self.ends)})?")

    def check(self, authority: str) -> bool:
        return self.low <= len(authority) <= self.high and bool(self.regex().fullmatch(authority))

    def lua(self) -> dict[str, Any]:
        """The same rule for ``lua/bbstage/directives.lua``, as Lua patterns."""

        def cls(items: tuple[str, ...]) -> str:
            return "[" + "".join(i if len(i) == 3 or i.isalnum() else "%" + i for i in items) + "]"

        ends, chars = cls(self.ends), cls(self.chars)
        return {
            "what": self.what,
            "rules": self.rules,
            "utf8": self.utf8,
            "low": self.low,
            "high": self.high,
            "one": f"^{ends}$",
            "many": f"^{ends}{chars}*{ends}$",
        }


class Backend:
    """One kind of storage (see the module's docstring). Class attributes and class methods
    only: the registry hands out classes, never instances."""

    name: ClassVar[str]  # its name in the registry and in messages: "s3", "posix"
    schemes: ClassVar[tuple[str, ...]] = ()  # URL schemes it serves ("az", "abfs")
    url_rule: ClassVar[UrlRule | None] = None  # None: a local path
    section: ClassVar[str | None] = None  # its table of the daemon config
    directive_keys: ClassVar[frozenset[str]] = frozenset()  # extra directive keys (profile=)
    env: ClassVar[tuple[str, ...]] = ()  # daemon environment variables its workers may see
    preload: ClassVar[tuple[str, ...]] = ()  # modules for the forkserver to import once
    movers: ClassVar[dict[tuple[str, str], str]] = {}  # fast paths: pair -> "module:Class"
    local: ClassVar[bool] = False  # a local file system path (byte ranges, capacity checks)
    read_only: ClassVar[bool] = False  # a source only (https://)
    assembles_pieces: ClassVar[bool] = False  # a destination that joins shares of one file
    # a source read in byte ranges, several at once, by the generic mover (a big file into a
    # local one): (bytes per ranged read, reads at once); None: one stream per file
    ranges: ClassVar[tuple[int, int] | None] = None

    @classmethod
    def check_settings(cls, raw: dict[str, Any]) -> None:
        """Check this backend's table of the daemon config; raise ``TransferError`` naming
        what is wrong. Nothing to check by default."""

    @classmethod
    def options(
        cls, settings: dict[str, Any], uid: int, directive: dict[str, str]
    ) -> BackendOptions | None:
        """The options one side of a transfer needs in the worker, from this backend's table
        of the config (``settings``), the job owner's ``uid`` (the daemon runs as root and
        may read what the administrator mapped to that user) and the directive's options."""
        return None

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        """An fsspec filesystem for ``url`` on this backend, in the worker, as the user (the
        generic mover's sides). Backends that cannot be one raise ``TransferError``."""
        raise TransferError(f"{cls.name} locations cannot be copied to or from other stores")

    @classmethod
    def strip(cls, url: str) -> str:
        """The path the fsspec filesystem takes for ``url`` (fsspec's ``_strip_protocol``)."""
        return url

    @classmethod
    def name_of(cls, rel: str) -> str:
        """The local name of ``rel``, a path below a tree's root as the store lists it."""
        return rel

    @classmethod
    def unstrip(cls, url: str, path: str) -> str:
        """The URL of ``path`` (as the filesystem names it) on the same store as ``url``."""
        return path
