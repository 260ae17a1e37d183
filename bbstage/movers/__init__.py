"""Movers and the registry of backends, keyed by URL scheme (as fsspec's ``registry.py``).

A location's kind is its URL scheme (``s3``, ``gs``, ...) or ``posix`` for a path
(``scratch``, a path in ``$BB_SCRATCH``, is ``posix`` here). Each kind is served by one
``Backend`` class (``bbstage.movers.backends``), named in ``known_implementations`` by a
lazy ``"module:Class"`` string with an install hint, imported on first use; tests and
plugins add their own with ``register_implementation``. ``posix`` and ``s3`` are always
enabled; the others when the daemon config enables them (``[backends] enabled``, read by
``bbstage.config``, which calls ``enable``). ``get(src_kind, dst_kind)`` is the mover for a
transfer: a backend's own fast path for that pair, else the generic fsspec mover.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import import_module
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
    "Progress", "TransferError", "UrlRule", "backend", "check_settings", "enable", "enabled",
    "env_names", "get", "known_implementations", "options_for", "preloads",
    "register_implementation", "splits_files", "url_rules",
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
_registry: dict[str, type[Backend]] = {}  # imported classes, by kind
_enabled: set[str] = set(ALWAYS)
_settings: dict[str, Any] = {}  # the daemon config's backend tables, typed (check_settings)


def register_implementation(kind: str, cls: type[Backend] | str, clobber: bool = False) -> None:
    """Add a backend (a class, or a lazy ``"module:Class"`` string) for ``kind``; an existing
    one is replaced only with ``clobber`` (tests, site plugins)."""
    if not clobber and (kind in _registry or kind in known_implementations):
        raise ValueError(f"a backend for {kind!r} is registered already (clobber=True replaces)")
    if isinstance(cls, str):
        known_implementations[kind] = {"class": cls, "err": f"cannot import {cls}"}
        _registry.pop(kind, None)
    else:
        _registry[kind] = cls


def backend(kind: str) -> type[Backend]:
    """The backend class for a location kind (imported on first use)."""
    kind = "posix" if kind == "scratch" else kind
    if kind not in _registry:
        entry = known_implementations.get(kind)
        if entry is None:
            raise TransferError(f"no backend for {kind}:// locations")
        module, name = entry["class"].split(":")
        try:
            _registry[kind] = getattr(import_module(module), name)
        except ImportError as exc:
            raise TransferError(f"the {kind} backend cannot load: {entry['err']} ({exc})") from None
    return _registry[kind]


def enable(kinds: Iterable[str]) -> None:
    """Enable these backends besides ``ALWAYS`` (the daemon config's ``[backends] enabled``)
    for this process; unknown names are refused (``TransferError``)."""
    kinds = list(kinds)
    unknown = [k for k in kinds if k not in known_implementations and k not in _registry]
    if unknown:
        known = ", ".join(sorted(set(known_implementations) - set(ALWAYS)))
        raise TransferError(f"[backends] enabled: unknown {unknown} (known: {known})")
    _enabled.clear()
    _enabled.update(ALWAYS, kinds)
    _settings.clear()


def enabled() -> list[str]:
    """The enabled kinds, sorted."""
    return sorted(_enabled)


def url_rules() -> dict[str, UrlRule]:
    """Scheme -> its ``UrlRule`` with the site's values (``Backend.site_rule``: the hosts
    ``allowed_hosts`` lists), for each enabled backend served through URLs (the directive
    parsers: ``bbstage.directives`` and, via ``bbstage_site.lua``, the Lua one)."""
    rules: dict[str, UrlRule] = {}
    for kind in enabled():
        cls = backend(kind)
        rule = cls.site_rule(_settings.get(cls.section or ""))
        if rule is not None and kind in cls.schemes:
            rules[kind] = rule
    return rules


def check_settings(
    sections: dict[str, Any], source: str = "daemon config", deprecated: list[str] | None = None
) -> dict[str, Any]:
    """Each enabled backend's table of the daemon config (``[s3]``, ``[gs]``...) read into
    its typed settings (``Backend.settings``; a missing table: the defaults), by table name;
    ``ConfigError`` names what is wrong (``source``: the file). The tables are then this
    process's, for the URL rules (``url_rules``) until the next ``enable``. Backends are
    imported only here, when a config is read for a daemon, and when a transfer needs them."""
    typed: dict[str, Any] = {}
    for kind in enabled():
        cls = backend(kind)
        if cls.section is not None and cls.section not in typed:
            raw = sections.get(cls.section, {})
            typed[cls.section] = cls.settings(raw, f"{source}: [{cls.section}]", deprecated)
    _settings.clear()
    _settings.update(typed)
    return typed


def options_for(
    kind: str, sections: dict[str, Any], uid: int, directive: dict[str, str]
) -> BackendOptions | None:
    """The typed options one side of a transfer carries to the worker (``Backend.options``),
    from the backend's typed settings in ``sections`` (``check_settings``'s)."""
    cls = backend(kind)
    table = sections.get(cls.section) if cls.section else None
    return cls.options(cls.typed(table), uid, directive)


def env_names(kinds: Iterable[str]) -> set[str]:
    """The daemon environment variables the backends of ``kinds`` let a worker see."""
    return {name for kind in kinds for name in backend(kind).env}


def preloads() -> list[str]:
    """Modules the forkserver imports once for the enabled backends (``Backend.preload``)."""
    seen: list[str] = []
    for kind in enabled():
        for module in backend(kind).preload:
            if module not in seen:
                seen.append(module)
    return seen


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
