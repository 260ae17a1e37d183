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

__all__ = ["Cancelled", "FileTask", "Mover", "MoverOptions", "Progress", "TransferError", "get"]

# (source kind, destination kind) -> "module:Class" under bbstage.movers.implementations
registry: dict[tuple[str, str], str] = {
    ("posix", "posix"): "posix:PosixMover",
    ("s3", "posix"): "s3:S3Download",
    ("posix", "s3"): "s3:S3Upload",
}


def get(src_kind: str, dst_kind: str) -> type[Mover]:
    """The mover class for a pair of location kinds."""
    src_kind = "posix" if src_kind == "scratch" else src_kind
    dst_kind = "posix" if dst_kind == "scratch" else dst_kind
    try:
        target = registry[(src_kind, dst_kind)]
    except KeyError:
        raise TransferError(f"staging from {src_kind} to {dst_kind} is not supported") from None
    module, cls = target.split(":")
    return getattr(import_module(f"bbstage.movers.implementations.{module}"), cls)
