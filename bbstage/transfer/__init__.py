"""What crosses from the engine to a worker and back: one typed spec, six typed events.

A ``TransferSpec`` is built from a directive in one place, ``TransferSpec.of_directive``
(the engine's, and ``bbstage bench``'s; tests use ``TransferSpec.between``); the executor
hands it to a worker process, which answers with events: ``Planned`` (the plan so far, now
and then while the source is walked — the walk runs a bounded window ahead of the copy, so
a tree is never held whole — and once ``final`` when the walk has ended), ``Moved`` now and
then, ``TempFile`` for each named temporary file before it is created and ``TempsSettled``
in batches once they were renamed or removed, and one outcome, ``Done`` (the manifest of
what it put in place, always after the final ``Planned``) or ``Failed``. All are frozen
dataclasses of plain values; the events come back to root through ``bbstage.transfer.codec`` (typed
JSON, never a pickle: a worker runs as the user). An executor that runs attempts on
transfer nodes (Dask) also tells the engine about each
with ``AttemptUpdate``, which no worker sends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

from bbstage import movers
from bbstage.movers.base import BackendOptions, FileRange

Overwrite = Literal["always", "never", "newer"]


@dataclass(frozen=True)
class ScratchLimit:
    """Staging into ``$BB_SCRATCH`` may fill ``path`` up to ``capacity`` bytes."""

    path: str
    capacity: int


@dataclass(frozen=True)
class TreeShard:
    """Shard ``index`` of ``count`` of a tree, run on one node while the others run theirs:
    the files whose destination path hashes to ``index`` (``bbstage.transfer.planning.in_shard``);
    every shard walks the whole tree and makes its directories."""

    index: int
    count: int


@dataclass(frozen=True)
class TransferSpec:
    """One directive's transfer, with every location resolved (no ``$BB_SCRATCH`` left)."""

    job_id: str
    source: str
    destination: str
    source_kind: str = "posix"  # posix, scratch or a URL scheme (bbstage.movers' registry)
    destination_kind: str = "posix"
    tree: bool = False  # source and destination end in /
    glob: bool = False
    checksum: str = "none"
    overwrite: Overwrite = "always"
    threads: int = 8
    chunk_size: int = 64 << 20
    # Each side's backend options (``Backend.options``: settings, the user's mapped
    # credentials); None where its backend needs none (a path).
    source_options: BackendOptions | None = None
    destination_options: BackendOptions | None = None
    scratch_limit: ScratchLimit | None = None
    resumed: bool = False  # an earlier attempt may have left temporary files behind
    # Only this part of the transfer, the others running on other nodes (Dask): a shard of
    # a tree's files, or a byte range of one file.
    part: TreeShard | FileRange | None = None

    @classmethod
    def of_directive(
        cls,
        job_id: str,
        directive: Mapping[str, Any],
        *,
        uid: int,
        backend_settings: Mapping[str, dict[str, Any]],
        threads: int,
        chunk_size: int,
        scratch_limit: ScratchLimit | None = None,
    ) -> TransferSpec:
        """The one builder of a directive's transfer: ``directive`` as ``bbstage.directives``
        parses it (``source``/``destination`` with ``$BB_SCRATCH`` already resolved, their
        kinds, ``tree``, ``glob``, ``options``), and each side's backend options for the
        owner ``uid`` from the site's ``backend_settings`` (``movers.options_for``: the
        settings, the owner's mapped credentials; never the account table)."""
        options = directive.get("options", {})
        source_kind = directive.get("source_kind", "posix")
        destination_kind = directive.get("destination_kind", "posix")

        def side(kind: str) -> BackendOptions | None:
            return movers.options_for(kind, backend_settings, uid, options)

        return cls(
            job_id=job_id,
            source=directive["source"],
            destination=directive["destination"],
            source_kind=source_kind,
            destination_kind=destination_kind,
            tree=bool(directive.get("tree")),
            glob=bool(directive.get("glob")),
            checksum=options.get("checksum", "none"),
            overwrite=cast(Overwrite, options.get("overwrite", "always")),
            threads=threads,
            chunk_size=chunk_size,
            source_options=side(source_kind),
            destination_options=side(destination_kind),
            scratch_limit=scratch_limit,
        )

    @classmethod
    def between(cls, source: str, destination: str, **fields: Any) -> TransferSpec:
        """A spec for two locations, their kinds told by their form (``scheme://...`` or a
        path), a trailing ``/`` meaning a tree; ``fields`` set the rest."""

        def kind(location: str) -> str:
            scheme, sep, _ = location.partition("://")
            return scheme if sep and "/" not in scheme else "posix"

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
    """What the transfer will move: the files and bytes not already in place. While the
    source is still walked the worker sends the counts so far (``final=False``, for
    ``bbstage status``); the ``final`` one counts every file the walk handed to the copy.
    ``skipped``: entries of the source that are no regular file, link or directory (FIFOs,
    sockets, devices), never copied, as rsync skips them."""

    bytes: int
    files: int
    final: bool = True
    skipped: int = 0


@dataclass(frozen=True)
class Moved:
    """Progress so far."""

    bytes: int
    files: int


@dataclass(frozen=True)
class TempFile:
    """A named temporary file the worker is about to create (sent first, so a worker killed
    right after still has it removed by the executor)."""

    path: str


@dataclass(frozen=True)
class TempsSettled:
    """Temporary files renamed into place or removed: the executor stops keeping them, so
    what it keeps is bounded by the files in flight, not by the files of the transfer."""

    paths: tuple[str, ...]


@dataclass(frozen=True)
class Done:
    """The manifest: files and bytes the worker verified in place, counted file by file as
    each was committed. The engine records success only if it matches the final
    ``Planned``."""

    bytes: int
    files: int

    def covers(self, plan: Planned) -> bool:
        return self.bytes == plan.bytes and self.files == plan.files


@dataclass(frozen=True)
class Failed:
    """The transfer failed; ``permanent`` failures are not worth retrying."""

    message: str
    permanent: bool = True


Event = Planned | Moved | TempFile | TempsSettled | Done | Failed


@dataclass(frozen=True)
class AttemptUpdate:
    """An attempt (one run of a transfer, or of one shard of it, on a transfer node) as an
    executor that has attempts tells the engine through ``on_event``: ``running`` once
    before it hands the attempt over (the engine records it then), again with the node and
    its progress, and once at its end (``done``, ``failed``, ``cancelled``). Not a worker's
    event: never read from a worker."""

    id: str
    shard: int
    shards: int
    state: str = "running"
    node: str = ""
    bytes: int = 0
    files: int = 0
    error: str = ""


def track_temps(temps: set[str], event: Event) -> bool:
    """Keep in ``temps`` the worker's temporary files that may exist: each from its
    ``TempFile`` (sent before it is created) until its ``TempsSettled`` (sent after its
    file was committed, so renamed, or removed). True if ``event`` was one of those two."""
    if isinstance(event, TempFile):
        temps.add(event.path)
    elif isinstance(event, TempsSettled):
        temps.difference_update(event.paths)
    else:
        return False
    return True
