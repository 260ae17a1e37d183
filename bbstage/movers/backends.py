"""The contract of a backend: everything bbstage knows about one kind of storage, keyed by
URL scheme (``s3``, ``gs``, ...; local paths are the ``posix`` backend).

A backend is one class (a subclass of ``Backend``) in its module or package under
``implementations/``, listed in the registry (``bbstage.movers.known_implementations``) by
the string ``"module:Class"`` so that nothing is imported before it is used. It owns:

* ``schemes`` and ``url_rule``: which URLs the directive parsers accept for it (the Python
  parser asks the registry; ``bbstage install-lua`` writes the same rules into
  ``bbstage_site.lua`` for the Lua one);
* ``section`` and ``settings_type``: its table of the daemon config (``[s3]``, ``[gs]``)
  and that table's frozen type (``bbstage.settings.Settings``, defined in its module),
  read once by ``settings`` (``verify`` adds what the types cannot say: a file exists);
  the typed settings travel to the worker in its options, never read again;
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
* its capabilities (``read_only``, ``assembles_pieces``, ``local``, ``ranges``,
  ``read_range``, ``read``, and, written by the generic mover, ``atomic_put``,
  ``put_block``, ``put_blocks_max``).

No module outside a backend names a scheme (``tests/unit/test_layout.py`` checks it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeVar

from bbstage.kinds import ConfigError
from bbstage.movers.base import BackendOptions, TransferError
from bbstage.settings import Settings, convert

T, R = TypeVar("T"), TypeVar("R")
INFOS = 16  # a listing without sizes: files asked for theirs at once (``Backend.infos``)


def at_once(ask: Callable[[T], R], items: list[T]) -> list[R]:
    """``ask(item)`` of each of ``items``, ``INFOS`` at once; the first error raised."""
    with ThreadPoolExecutor(INFOS, thread_name_prefix="info") as pool:
        return list(pool.map(ask, items))


# where a range's bytes go: (their offset in the file, the bytes: valid during the call alone,
# a reader may reuse its buffer)
Into = Callable[[int, bytes | memoryview], None]


@dataclass(frozen=True)
class UrlRule:
    """The part of ``scheme://authority/path`` a directive parser checks at ``sbatch``:
    ``authority`` (a bucket, a container, a host) has ``low``-``high`` characters of
    ``chars`` (ranges such as ``"a-z"`` or single characters), starting and ending with one
    of ``ends``; ``what`` names it in messages (``S3 bucket``) and ``rules`` says the rule in
    words. ``utf8``: the path must be UTF-8 text (object keys are).

    A rule whose authority names a host to reach (``[user@]host[:port]``, ``port`` its
    default port) takes only the ``hosts`` the site lists (``"host:port"``, lower-case), in
    the daemon config's ``key`` (``Backend.site_rule`` fills them in)."""

    what: str
    rules: str
    chars: tuple[str, ...]
    ends: tuple[str, ...]
    low: int
    high: int
    utf8: bool = True
    port: int | None = None
    hosts: frozenset[str] = frozenset()
    key: str = ""

    def regex(self) -> re.Pattern[str]:
        """The authority rule as a Python regular expression (``fullmatch``)."""

        def cls(items: tuple[str, ...]) -> str:
            return "[" + "".join(i if len(i) == 3 else re.escape(i) for i in items) + "]"

        return re.compile(f"{cls(self.ends)}(?:{cls(self.chars)}*{cls(self.ends)})?")

    def check(self, authority: str) -> bool:
        return self.low <= len(authority) <= self.high and bool(self.regex().fullmatch(authority))

    def host(self, authority: str) -> str:
        """``authority`` (``[user@]host[:port]``, or an ``allowed_hosts`` entry) as the
        ``"host:port"`` it reaches: lower-case, the default port if none, no leading zeros
        (the Lua parser computes the same with string functions)."""
        where = authority.rpartition("@")[2].lower()
        m = re.fullmatch(r"(.*):0*([0-9]+)", where)
        return f"{m[1]}:{m[2]}" if m else f"{where}:{self.port}"

    def refused_host(self, authority: str) -> str | None:
        """The ``"host:port"`` of ``authority`` if the site has not listed it, else None
        (None too for a rule that names no host to reach)."""
        if self.port is None:
            return None
        name = self.host(authority)
        return None if name in self.hosts else name

    def lua(self) -> dict[str, Any]:
        """The same rule for ``lua/bbstage/directives.lua``, as Lua patterns."""

        def cls(items: tuple[str, ...]) -> str:
            return "[" + "".join(i if len(i) == 3 or i.isalnum() else "%" + i for i in items) + "]"

        ends, chars = cls(self.ends), cls(self.chars)
        rule: dict[str, Any] = {
            "what": self.what,
            "rules": self.rules,
            "utf8": self.utf8,
            "low": self.low,
            "high": self.high,
            "one": f"^{ends}$",
            "many": f"^{ends}{chars}*{ends}$",
        }
        if self.port is not None:  # a set: hosts["host:port"] == true
            rule.update(port=self.port, key=self.key, hosts=self.hosts)
        return rule


class Backend:
    """One kind of storage (see the module's docstring). Class attributes and class methods
    only: the registry hands out classes, never instances."""

    name: ClassVar[str]  # its name in the registry and in messages: "s3", "posix"
    schemes: ClassVar[tuple[str, ...]] = ()  # URL schemes it serves ("az", "abfs")
    url_rule: ClassVar[UrlRule | None] = None  # None: a local path
    # its URLs name a host to reach, by default on this port: only the hosts its table's
    # allowed_hosts lists (checked at sbatch by site_rule's rule, and again when connecting)
    port: ClassVar[int | None] = None
    section: ClassVar[str | None] = None  # its table of the daemon config
    settings_type: ClassVar[type[Settings] | None] = None  # that table's type
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
    # a store written by the generic mover (another store's data, no fast path for the
    # pair): an object appears whole when its upload completes (written in place; False: a
    # temporary name, renamed); a big upload's chunk if not its filesystem's own, and the
    # store's limit on one upload's chunks
    atomic_put: ClassVar[bool] = True
    put_block: ClassVar[int | None] = None
    put_blocks_max: ClassVar[int | None] = None

    @classmethod
    def read_range(cls, fs: Any, path: str, start: int, end: int, into: Into) -> int:
        """Read bytes ``start`` to ``end`` of ``path`` and hand them to ``into(offset,
        data)``, in one piece or several, each at its offset (not always in order: SFTP's
        parallel reads); the number of bytes read (fewer than asked: the caller says the
        read was short). Each call its own request, so ranges are read at once from several
        threads."""
        data = fs.cat_file(path, start, end)
        into(start, data)
        return len(data)

    @classmethod
    def read(cls, fs: Any, path: str, size: int) -> bytes:
        """A small file whole, in one request (the generic mover's files of up to 4 MiB),
        planned at ``size`` bytes by its listing: a store whose server the user may choose
        reads no more than ``size`` + 1 (HTTPS, ``httpget.too_much``); the mover refuses a
        file of another size."""
        return bytes(fs.cat_file(path))

    @classmethod
    def write(cls, fs: Any, path: str, data: bytes) -> None:
        """A small file whole, in one request (the generic mover's files of up to 4 MiB):
        fsspec's ``pipe_file``. A store with directories (``atomic_put`` False) has had
        ``path``'s made by the mover, once per transfer."""
        fs.pipe_file(path, data)

    @classmethod
    def find(cls, fs: Any, root: str) -> dict[str, dict[str, Any]]:
        """Every file and directory below ``root`` (a path as ``strip`` gives it, without a
        trailing ``/``), by path, each with its info (``type``, ``size``, a modification
        time): fsspec's ``find``. Empty when nothing is there."""
        found: dict[str, dict[str, Any]] = fs.find(root, withdirs=True, detail=True)
        return found

    @classmethod
    def info(cls, fs: Any, path: str) -> dict[str, Any]:
        """One file's info (``type``, ``size``, a modification time), for a listing that
        gives no sizes (HTTP's): fsspec's ``info``."""
        info: dict[str, Any] = fs.info(path)
        return info

    @classmethod
    def infos(cls, fs: Any, paths: list[str]) -> Iterable[dict[str, Any]]:
        """``info`` of each of ``paths`` (a listing without sizes), in order, ``INFOS``
        asked at once; the first error raised. An iterator may answer each as it comes
        (the plan is read as it is made)."""
        return at_once(lambda path: cls.info(fs, path), paths)

    @classmethod
    def prefetch(cls, fs: Any, path: str, size: int) -> None:
        """Start reading a small file that ``read`` will be asked for (a hint, never an
        error: ``read`` fails as it would have). By default nothing is started."""

    @classmethod
    def close(cls, fs: Any) -> None:
        """The transfer has ended: stop what ``fs`` still does for it (reads started ahead).
        By default nothing."""

    @classmethod
    def settings(
        cls, raw: Any, where: str | None = None, deprecated: list[str] | None = None
    ) -> Any:
        """This backend's table of the daemon config (``raw``, as tomllib reads it) as its
        ``settings_type`` (None for a backend without a table); ``ConfigError`` naming
        ``where`` (default ``[section]``), the key and what was expected; old forms still
        read are told in ``deprecated``."""
        if cls.settings_type is None:
            return None
        where = where or f"[{cls.section}]"
        typed = convert(raw, cls.settings_type, where, deprecated)
        cls.verify(typed, where)
        return typed

    @classmethod
    def verify(cls, settings: Any, where: str) -> None:
        """What the types cannot say of read settings (a file they name exists): raise
        ``ConfigError``. Nothing by default."""

    @classmethod
    def check_settings(cls, raw: Any) -> Any:
        """``settings``, its errors as ``TransferError`` (``daemon config [section] ...``)."""
        try:
            return cls.settings(raw, f"daemon config [{cls.section}]")
        except ConfigError as exc:
            raise TransferError(str(exc)) from None

    @classmethod
    def typed(cls, settings: Any) -> Any:
        """This backend's typed settings: read ones as they are; None: the defaults; a table
        (a dict: options built by hand, tests) read by ``check_settings``."""
        if cls.settings_type is None or isinstance(settings, cls.settings_type):
            return settings if cls.settings_type is not None else None
        if settings is None:
            return cls.settings_type()
        return cls.check_settings(dict(settings))

    @classmethod
    def site_rule(cls, settings: Any) -> UrlRule | None:
        """``url_rule`` with this site's values from this backend's table of the config
        (``settings``), as the directive parsers check it at ``sbatch``: for a backend whose
        URLs name a host to reach (``port``), the hosts ``allowed_hosts`` lists (entries
        ``host`` or ``host:port``, checked by ``check_settings``). The worker checks the host
        again before it connects: the config may change while a job waits."""
        rule = cls.url_rule
        if rule is None or cls.port is None:
            return rule
        rule = replace(rule, port=cls.port, key=f"[{cls.section}] allowed_hosts")
        if isinstance(settings, dict):  # a table as written (tests): its entries as they are
            allowed = settings.get("allowed_hosts", [])
        else:
            allowed = getattr(settings, "allowed_hosts", ())
        hosts = frozenset(rule.host(str(e).strip()) for e in allowed)
        return replace(rule, hosts=hosts)

    @classmethod
    def options(cls, settings: Any, uid: int, directive: dict[str, str]) -> BackendOptions | None:
        """The options one side of a transfer needs in the worker, from this backend's typed
        settings (``settings``, ``typed``), the job owner's ``uid`` (the daemon runs as root
        and may read what the administrator mapped to that user) and the directive's options."""
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
