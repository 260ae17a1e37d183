"""Movers: one small module per backend under ``implementations/``, found through a registry.

A location's kind (``posix``, ``scratch`` resolved to ``posix``, ``s3``) picks the mover:
``get("posix", "s3")`` is the class that uploads local files to S3.
"""

from __future__ import annotations

from importlib import import_module

from bbstage.movers.base import (
    Cancelled,
    FileTask,
    Mover,
    MoverOptions,
    Progress,
    TransferError,
)

__all__ = [
    "Cancelled", "FileTask", "Mover", "MoverOptions", "Progress", "TransferError",
    "check_settings", "get",
]  # fmt: skip

# (source kind, destination kind) -> "module:Class" under bbstage.movers.implementations
registry: dict[tuple[str, str], str] = {
    ("posix", "posix"): "posix:PosixMover",
    ("s3", "posix"): "s3:S3Download",
    ("posix", "s3"): "s3:S3Upload",
}
# location kind -> "module:Class" of its daemon-side settings (a ``from_config`` classmethod)
settings: dict[str, str] = {
    "s3": "s3.settings:S3Settings",
}


def _load(target: str) -> object:
    module, name = target.split(":")
    return getattr(import_module(f"bbstage.movers.implementations.{module}"), name)


def check_settings(kind: str, raw: dict[str, object]) -> None:
    """Check a backend's table of the daemon config (e.g. ``[s3]``); ``TransferError`` names
    what is wrong. The backend is imported only here, when a config is read for a daemon."""
    if kind in settings:
        _load(settings[kind]).from_config(raw)  # type: ignore[attr-defined]


def get(src_kind: str, dst_kind: str) -> type[Mover]:
    """The mover class for a pair of location kinds."""
    src_kind = "posix" if src_kind == "scratch" else src_kind
    dst_kind = "posix" if dst_kind == "scratch" else dst_kind
    try:
        target = registry[(src_kind, dst_kind)]
    except KeyError:
        raise TransferError(f"staging from {src_kind} to {dst_kind} is not supported") from None
    return _load(target)  # type: ignore[return-value]
