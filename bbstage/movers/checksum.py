"""Optional end-to-end checksums (``checksum=`` directive option)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import Any

import xxhash

from bbstage.movers.base import TransferError
from bbstage.movers.localfs import open_source

ALGORITHMS: dict[str, Callable[[], Any]] = {
    "xxh3": xxhash.xxh3_128,
    "blake2b": hashlib.blake2b,
}
_BLOCK = 4 << 20


def check(algorithm: str) -> None:
    """Refuse an algorithm we do not have (the directive parsers allow only these)."""
    if algorithm != "none" and algorithm not in ALGORITHMS:
        raise TransferError(f"unknown checksum {algorithm!r} (use {', '.join(ALGORITHMS)})")


def new(algorithm: str) -> Any:
    """A fresh hash object (``update``, ``hexdigest``) for bytes fed in order."""
    return ALGORITHMS[algorithm]()


def digest_fd(algorithm: str, fd: int) -> str:
    h = ALGORITHMS[algorithm]()
    offset = 0
    while block := os.pread(fd, _BLOCK, offset):
        h.update(block)
        offset += len(block)
    return h.hexdigest()


def digest_path(algorithm: str, path: str, *, follow: bool = False) -> str:
    """The digest of the source file at ``path`` (``localfs.open_source``: never blocks)."""
    fd = open_source(path, follow=follow)
    try:
        return digest_fd(algorithm, fd)
    finally:
        os.close(fd)


def verify(algorithm: str, src_path: str, dst_fd: int, *, follow: bool = False) -> None:
    """Compare the source file with what was written; a mismatch is retried."""
    check(algorithm)
    if digest_path(algorithm, src_path, follow=follow) != digest_fd(algorithm, dst_fd):
        raise TransferError(f"checksum mismatch ({algorithm}): {src_path}", permanent=False)
