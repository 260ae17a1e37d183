"""Movers and the registry of backends, keyed by URL scheme (as fsspec's ``registry.py``).

A location's kind is its URL scheme (``s3``, ``gs``, ...) or ``posix`` for a path
(``scratch``, a path in ``$BB_SCRATCH``, is ``posix`` here). Each kind is served by one
``Backend`` class (``bbstage.movers.backends``), named in ``known_implementations`` by a
lazy ``"module:Class"`` string with an install hint, imported on first use; tests and
plugins add their own with ``register_implementation``. Which backends a site enables is
a ``Registry``, a value: ``posix`` and ``s3`` always, the others when the daemon config
enables them (``[backends] enabled``: ``bbstage.config`` builds the registry and its
``Config`` holds it). ``get(src_kind, dst_kind)`` is the mover for a transfer: a backend's
own fast path for that pair, else the generic fsspec mover; these lookups read no config.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import import_module
from types import MappingProxyType
from typing import Any

from bbstage.kinds import ConfigError
from bbstage.movers.backends import Backend, UrlRule
from bbstage.movers.base import (
    BackendOptions,
    Cancelled,
    FileTask,
    Mover,
    MoverOptions,
    Progress,
    TransferError,
)

__all__ = [
    "Backend", "BackendOptions", "Cancelled", "ConfigError", "FileTask", "Mover", "MoverOptions",
    "Progress", "Registry", "TransferError", "UrlRule", "backend", "env_names", "get",
    "known_implementations", "options_for", "register_implementation", "splits_files",
]  # fmt: skip

_IMPL = "bbstage.movers.implementations"
_STORES = "install bbstage's stores extra (pip install 'bbstage[stores]')"


def _lazy(target: str, err: str) -> dict[str, str]:
    """A registry entry: ``target`` (``"module:Class"`` below ``implementations/``) and what
    to install when it cannot be imported."""
    return {"class": f"{_IMPL}.{target}", "err": err}


# kind -> {"class": "module:Class", "err": what to install when the import fails}; one line
# a backend (Azure's two schemes share theirs)
known_implementations: dict[str, dict[str, str]] = {
    **{k: _lazy("azure:AzureBackend", f"adlfs is missing: {_STORES}") for k in ("abfs", "az")},
    "gs": _lazy("gcs:GCSBackend", f"gcsfs is missing: {_STORES}"),
    "https": _lazy("https:HTTPSBackend", f"aiohttp is missing: {_STORES}"),
    "posix": _lazy("posix:PosixBackend", "bbstage is incomplete"),
    "s3": _lazy("s3:S3Backend", "s3fs is missing: pip install bbstage"),
    "sftp": _lazy("sftp:SFTPBackend", f"sshfs is missing: {_STORES}"),
}
assert list(known_implementations) == sorted(known_implementations)  # as fsspec's

ALWAYS = ("posix", "s3")  # enabled without a word in the config (bbstage's first backends)
_imported: dict[str, type[Backend]] = {}  # classes imported (or registered), by kind: a cache


def register_implementation(kind: str, cls: type[Backend] | str, clobber: bool = False) -> None:
    """Add a backend (a class, or a lazy ``"module:Class"`` string) for ``kind``; an existing
    one is replaced only with ``clobber`` (tests, site plugins)."""
    if not clobber and (kind in _imported or kind in known_implementations):
        raise ValueError(f"a backend for {kind!r} is registered already (clobber=True replaces)")
    if isinstance(cls, str):
        known_implementations[kind] = {"class": cls, "err": f"cannot import {cls}"}
        _imported.pop(kind, None)
    else:
        _imported[kind] = cls


def backend(kind: str) -> type[Backend]:
    """The backend class for a location kind (imported on first use), whether a config
    enables it or not: what a worker needs for the kinds its spec names."""
    kind = "posix" if kind == "scratch" else kind
    if kind not in _imported:
        entry = known_implementations.get(kind)
        if entry is None:
            raise TransferError(f"no backend for {kind}:// locations")
        module, name = entry["class"].split(":")
        try:
            _imported[kind] = getattr(import_module(module), name)
        except ImportError as exc:
            raise TransferError(f"the {kind} backend cannot load: {entry['err']} ({exc})") from None
    return _imported[kind]


class Registry:
    """The backends one daemon config enables (``ALWAYS`` and ``[backends] enabled``) and
    their tables typed (``[s3]``, ``[gs]``...): a value, built by ``bbstage.config`` and
    held by its ``Config`` (``config.registry``), passed to whatever reads it (the
    directive parsers, the forkserver's preloads). ``Registry()`` is the default: posix
    and s3 with their default settings. Nothing here changes once built."""

    __slots__ = ("_kinds", "_settings")

    def __init__(self, kinds: Iterable[str] = (), settings: Mapping[str, Any] | None = None):
        """Enable ``kinds`` besides ``ALWAYS``; unknown names are refused (``TransferError``).
        ``settings``: the typed tables by name (``with_settings`` reads them)."""
        kinds = list(kinds)
        unknown = [k for k in kinds if k not in known_implementations and k not in _imported]
        if unknown:
            known = ", ".join(sorted(set(known_implementations) - set(ALWAYS)))
            raise TransferError(f"[backends] enabled: unknown {unknown} (known: {known})")
        self._kinds = frozenset((*ALWAYS, *kinds))
        self._settings = MappingProxyType(dict(settings or {}))

    @classmethod
    def default(cls) -> Registry:
        """posix and s3, with their defaults (a site without ``[backends]``)."""
        return cls()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Registry):
            return NotImplemented
        return self._kinds == other._kinds and dict(self._settings) == dict(other._settings)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Registry({self.enabled()!r}, tables={sorted(self._settings)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Registry, (sorted(self._kinds), dict(self._settings)))

    @property
    def settings(self) -> Mapping[str, Any]:
        """The enabled backends' typed tables, by name (``with_settings``'s)."""
        return self._settings

    def enabled(self) -> list[str]:
        """The enabled kinds, sorted."""
        return sorted(self._kinds)

    def backend(self, kind: str) -> type[Backend]:
        """The backend class for a location kind (``backend``)."""
        return backend(kind)

    def tables(self) -> dict[str, str]:
        """The enabled backends' table names in the daemon config, each with its kind."""
        found: dict[str, str] = {}
        for kind in self.enabled():
            section = backend(kind).section
            if section is not None:
                found[section] = kind
        return found

    def url_rules(self) -> dict[str, UrlRule]:
        """Scheme -> its ``UrlRule`` with the site's values (``Backend.site_rule``: the
        hosts ``allowed_hosts`` lists), for each enabled backend served through URLs (the
        directive parsers: ``bbstage.directives`` and, via ``bbstage_site.lua``, the Lua
        one)."""
        rules: dict[str, UrlRule] = {}
        for kind in self.enabled():
            cls = backend(kind)
            rule = cls.site_rule(self._settings.get(cls.section or ""))
            if rule is not None and kind in cls.schemes:
                rules[kind] = rule
        return rules

    def with_settings(
        self,
        sections: Mapping[str, Any],
        source: str = "daemon config",
        deprecated: list[str] | None = None,
    ) -> Registry:
        """This registry with each enabled backend's table of the daemon config (``[s3]``,
        ``[gs]``...) read into its typed settings (``Backend.settings``; a missing table:
        the defaults); ``ConfigError`` names what is wrong (``source``: the file). Backends
        are imported only here, when a config is read for a daemon, and when a transfer
        needs them."""
        typed: dict[str, Any] = {}
        for kind in self.enabled():
            cls = backend(kind)
            if cls.section is not None and cls.section not in typed:
                raw = sections.get(cls.section, {})
                typed[cls.section] = cls.settings(raw, f"{source}: [{cls.section}]", deprecated)
        return Registry(self._kinds - set(ALWAYS), typed)

    def preloads(self) -> list[str]:
        """Modules the forkserver imports once for the enabled backends
        (``Backend.preload``)."""
        seen: list[str] = []
        for kind in self.enabled():
            for module in backend(kind).preload:
                if module not in seen:
                    seen.append(module)
        return seen


def options_for(
    kind: str, sections: Mapping[str, Any], uid: int, directive: dict[str, str]
) -> BackendOptions | None:
    """The typed options one side of a transfer carries to the worker (``Backend.options``),
    from the backend's typed settings in ``sections`` (``Registry.with_settings``'s)."""
    cls = backend(kind)
    table = sections.get(cls.section) if cls.section else None
    return cls.options(cls.typed(table), uid, directive)


def env_names(kinds: Iterable[str]) -> set[str]:
    """The daemon environment variables the backends of ``kinds`` let a worker see."""
    return {name for kind in kinds for name in backend(kind).env}


def splits_files(src_kind: str, dst_kind: str) -> bool:
    """Can one file be copied in shares on several nodes (byte ranges into a local file, or
    pieces a store assembles)? Only through a backend's own fast path with a local side."""
    src, dst = backend(src_kind), backend(dst_kind)
    pair = (src.name, dst.name)
    return (pair in src.movers or pair in dst.movers) and (src.local or dst.local)


def get(src_kind: str, dst_kind: str) -> type[Mover]:
    """The mover class for a pair of location kinds: the fast path one of the two backends
    declares for exactly this pair, else the generic one (any store to any store, through
    the worker)."""
    src, dst = backend(src_kind), backend(dst_kind)
    if dst.read_only:
        raise TransferError(f"{dst.name} locations are read-only: stage from them, not to them")
    pair = (src.name, dst.name)
    target = src.movers.get(pair) or dst.movers.get(pair) or f"{_IMPL}.generic.mover:GenericMover"
    module, name = target.split(":")
    return getattr(import_module(module), name)  # type: ignore[no-any-return]
