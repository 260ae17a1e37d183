"""The values every part of ``bbstage bench`` shares: what to generate, where, how, and a
timed run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from bbstage.config import Config
from bbstage.units import parse_size

MB = 1_000_000  # throughput is reported in MB/s = 10^6 bytes per second


class BenchError(Exception):
    """The benchmark cannot run as asked; the message says why and what to do."""


@dataclass
class Location:
    """Where the benchmark writes: a local directory or an ``s3://bucket/prefix``."""

    text: str

    @property
    def kind(self) -> str:
        return "s3" if self.text.startswith("s3://") else "posix"

    def join(self, *parts: str) -> str:
        return "/".join([self.text.rstrip("/"), *parts])


@dataclass
class Plan:
    """What to generate: ``files`` files of ``file_size`` bytes."""

    files: int
    file_size: int

    @property
    def total(self) -> int:
        return self.files * self.file_size


def plan_sizes(files: int | None, file_size: str | int | None, total: str | int | None) -> Plan:
    """Any two of files / file size / total determine the third (defaults: 1000 × 1M)."""
    size = parse_size(file_size) if file_size is not None else None
    whole = parse_size(total) if total is not None else None
    if files is not None and size is not None and whole is not None:
        if files * size != whole:
            raise BenchError("--files × --file-size must equal --total (or give only two)")
    if files is None:
        if whole is not None and size is not None:
            files = max(1, whole // max(size, 1))
        elif whole is not None:
            files = 1000 if whole >= 1000 * 4096 else 1
        else:
            files = 1000
    if size is None:
        size = whole // files if whole is not None else 1 << 20
    if files < 1:
        raise BenchError("--files must be at least 1")
    return Plan(files, size)


@dataclass
class Options:
    """One ``bbstage bench`` invocation."""

    source: str
    destination: str
    plan: Plan
    repeat: int = 1
    baselines: bool = True
    peers: tuple[str, ...] = ()  # S3 baselines asked for (s5cmd, rclone)
    cache: str = "auto"  # auto | drop | warm
    keep: bool = False
    checksum: str = "none"
    profile: str | None = None
    config: Config = field(default_factory=Config)
    progress: bool = True
    # Runs our timed transfer elsewhere (``--executor dask``: ``bbstage.bench.run.Relay``,
    # to the transfer nodes); None: in this process.
    runner: Any = None


@dataclass
class Run:
    """One timed copy."""

    seconds: float
    bytes: int
    files: int
    latencies: list[float] = field(default_factory=list)
    samples: list[tuple[float, int, int]] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else math.inf

    @property
    def files_per_s(self) -> float:
        return self.files / self.seconds if self.seconds > 0 else math.inf
