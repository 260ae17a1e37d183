"""The generated data set, and the scratch directories it lives in."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from bbstage.bench.model import Plan

PER_DIR = 1000  # generated files per directory


def generate(root: str, plan: Plan) -> str:
    """Write the data set under ``root``; return the path to stage (a file, or a tree ``/``)."""
    os.makedirs(root, exist_ok=True)
    block = os.urandom(min(max(plan.file_size, 1), 4 << 20))
    if plan.files == 1:
        path = os.path.join(root, "data.bin")
        _write(path, plan.file_size, block, 0)
        return path
    data = os.path.join(root, "data")
    for i in range(plan.files):
        sub = os.path.join(data, f"d{i // PER_DIR:04d}")
        if i % PER_DIR == 0:
            os.makedirs(sub, exist_ok=True)
        _write(os.path.join(sub, f"f{i:07d}"), plan.file_size, block, i)
    return data + "/"


def _write(path: str, size: int, block: bytes, seed: int) -> None:
    """``size`` bytes made of ``block``, each block stamped with (file, offset) so no two agree."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        done = 0
        while done < size:
            n = min(len(block), size - done)
            stamp = f"{seed}:{done}:".encode()[:n]
            os.write(fd, stamp + block[len(stamp) : n])
            done += n
    finally:
        os.close(fd)


def new_tag() -> str:
    """A name for this run's directories that no concurrent run shares."""
    return f"bbstage-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def clear(work: str) -> None:
    """Remove every destination under ``work`` (a fresh destination for each copy)."""
    for name in os.listdir(work):
        path = os.path.join(work, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


@contextmanager
def cleanup(paths: list[str], keep: bool) -> Iterator[None]:
    """Remove ``paths`` at the end, however the block ends, unless ``keep``."""
    try:
        yield
    finally:
        if not keep:
            for path in paths:
                shutil.rmtree(path, ignore_errors=True)
