"""What crosses from the engine to a worker and back: one typed spec, five typed events.

The engine builds a ``TransferSpec`` from a directive (``Engine._spec``; tools and tests use
``TransferSpec.between``); the executor hands it to a worker process, which answers with
events: ``Planned`` once, ``Moved`` now and then, ``TempFile`` for each named temporary file,
and one outcome, ``Done`` (the manifest of what it put in place) or ``Failed``. All are frozen
dataclasses of plain values, so they pickle over a pipe or a network unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

Overwrite = Literal["always", "never", "newer"]


@dataclass(frozen=True)
class ScratchLimit:
    """Staging into ``$BB_SCRATCH`` may fill ``path`` up to ``capacity`` bytes."""

    path: str
    capacity: int


@dataclass(frozen=True)
class TransferSpec:
    """One directive's transfer, with every location resolved (no ``$BB_SCRATCH`` left)."""

    job_id: str
    source: str
    destination: str
    source_kind: str = "posix"  # posix, scratch or s3
    destination_kind: str = "posix"
    tree: bool = False  # source and destination end in /
    glob: bool = False
    checksum: str = "none"
    overwrite: Overwrite = "always"
    threads: int = 8
    chunk_size: int = 64 << 20
    extra: dict[str, Any] = field(default_factory=dict)  # backend settings (S3 keys...)
    scratch_limit: ScratchLimit | None = None
    resumed: bool = False  # an earlier attempt may have left temporary files behind

    @classmethod
    def between(cls, source: str, destination: str, **fields: Any) -> TransferSpec:
        """A spec for two locations, their kinds told by their form (``s3://`` or a path),
        a trailing ``/`` meaning a tree; ``fields`` set the rest."""

        def kind(location: str) -> str:
            return "s3" if location.startswith("s3://") else "posix"

        values: dict[str, Any] = {
            "job_id": "0",
            "source_kind": kind(source),
            "destination_kind": kind(destination),
            "tree": source.endswith("/"),
            **fields,
        }
        return cls(source=source, destination=destination, **values)

    def but(self, **changes: Any) -> TransferSpec:
        """A copy with ``changes``."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Planned:
    """What the transfer will move: the files and bytes not already in place."""

    bytes: int
    files: int


@dataclass(frozen=True)
class Moved:
    """Progress so far."""

    bytes: int
    files: int


@dataclass(frozen=True)
class TempFile:
    """A named temporary file the worker created (removed by the executor if it dies)."""

    path: str


@dataclass(frozen=True)
class Done:
    """The manifest: files and bytes the worker verified in place, counted file by file as
    each was committed. The engine records success only if it matches ``Planned``."""

    bytes: int
    files: int

    def covers(self, plan: Planned) -> bool:
        return self.bytes == plan.bytes and self.files == plan.files


@dataclass(frozen=True)
class Failed:
    """The transfer failed; ``permanent`` failures are not worth retrying."""

    message: str
    permanent: bool = True


Event = Planned | Moved | TempFile | Done | Failed
