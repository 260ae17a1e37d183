"""The one contract every mover implements, and the errors movers raise."""

from __future__ import annotations

import errno
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

Kind = Literal["file", "dir", "link", "special"]  # special: a FIFO, socket or device, skipped


class TransferError(Exception):
    """A transfer failed. ``permanent`` errors are not retried; the message is for the user."""

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.permanent = permanent


class Cancelled(TransferError):
    """The transfer was cancelled (job teardown with hurry=true, or daemon shutdown)."""

    def __init__(self) -> None:
        super().__init__("cancelled", permanent=True)


_PERMANENT = {
    errno.ENOENT: "no such file or directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EISDIR: "is a directory",
    errno.ENOTDIR: "not a directory",
    errno.ELOOP: "refusing to follow a symbolic link",
    errno.EEXIST: "already exists",
    errno.ENAMETOOLONG: "file name too long",
}


def os_error(exc: OSError, path: str | None = None) -> TransferError:
    """Turn an OSError into a TransferError whose message names the path."""
    where = path or exc.filename or "?"
    if exc.errno in _PERMANENT:
        return TransferError(f"{_PERMANENT[exc.errno]}: {where}", permanent=True)
    return TransferError(f"{exc.strerror or exc}: {where}", permanent=False)


def not_a_tree(path: str) -> TransferError:
    """A tree's source (``.../``) that is a file, on any store: what to fix."""
    return TransferError(f"not a directory: {path} (drop the trailing / to stage a file)")


def not_a_file(path: str) -> TransferError:
    """A file's source that is a directory, on any store: what to fix."""
    return TransferError(
        f"is a directory: {path} (end the source and destination with / to stage a tree)"
    )


def safe_rel(rel: str, url: str) -> str:
    """``rel``, the path below a tree's source of a file a store listed (``url``), refused
    if it is not a safe relative path: led by ``/``, or with a component that is empty,
    ``.`` or ``..``. A store's names are its own (a key, a blob's name, a server's index),
    and ``a/../../x`` would land outside the destination."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise TransferError(
            f"refusing to stage {url}: its name is not a safe relative path ({rel!r}), it"
            " would land outside the destination"
        )
    return rel


@dataclass(frozen=True)
class FileRange:
    """Byte range ``index`` of ``count`` of one file, run on one node while the others run
    theirs (written by ``bbstage.transfer.ranges``; to a store that assembles pieces:
    ``Mover.copy_share``),
    written into one temporary file that the submission's ranges share (``group``: its id,
    8 hex digits); a file under ``min_size`` bytes is copied whole by range 0 alone."""

    index: int
    count: int
    group: str
    min_size: int = 0


def span(part: FileRange, size: int) -> tuple[int, int]:
    """(offset, count) of ``part``'s share of ``size`` bytes: equal shares, the rest last."""
    step = size // part.count
    start = step * part.index
    end = size if part.index == part.count - 1 else start + step
    return start, end - start


@dataclass(frozen=True)
class FileTask:
    """One entry of a plan: copy ``src`` to ``dst``."""

    src: str
    dst: str
    kind: Kind = "file"
    size: int = 0
    mode: int | None = None
    mtime_ns: int | None = None
    target: str | None = None  # for links
    follow: bool = False  # open ``src`` through a symbolic link (a single-file source's own)


class Progress(Protocol):
    """Where a mover reports what it did (thread-safe)."""

    def add(self, nbytes: int) -> None: ...
    def temp(self, path: str) -> None: ...


@dataclass(frozen=True)
class BackendOptions:
    """What one side of a transfer needs in the worker, typed per backend (a subclass, in
    the backend's own module). It travels root -> worker in the ``TransferSpec`` (a pickle
    from root) and nowhere else; a side whose backend needs nothing has ``None``."""


OptionsT = TypeVar("OptionsT", bound=BackendOptions)


@dataclass
class MoverOptions:
    job_id: str = "0"
    threads: int = 8
    chunk_size: int = 64 << 20
    checksum: str = "none"
    source: BackendOptions | None = None  # the source's backend's options
    destination: BackendOptions | None = None
    source_kind: str = "posix"  # the two location kinds (the generic mover's two backends)
    destination_kind: str = "posix"
    # the destinations this transfer copies (a shard's share of a tree: the worker drops the
    # rest of the plan); a mover may ask nothing about the others (None: all)
    wanted: Callable[[str], bool] | None = None

    def side(self, cls: type[OptionsT]) -> OptionsT | None:
        """This transfer's options of type ``cls``, from whichever side has them."""
        for options in (self.source, self.destination):
            if isinstance(options, cls):
                return options
        return None


class Mover(ABC):
    """Moves data from one kind of location to another. One instance per transfer.

    ``plan`` lists what to copy (expanding trees and globs), as an iterable the worker reads
    once, in order: a directory comes before anything in it. It may be a list (one object,
    a glob of S3 keys) or a lazy iterator (a local tree walked, or an S3 prefix listed a
    page at a time, as it is copied, so memory does not grow with the number of files);
    errors about the source as a whole (missing, not a directory, nothing matches) are
    raised by ``plan`` itself, errors met while walking by the iterator. ``copy`` copies one
    entry, writing to a temporary name beside the destination and renaming it into place
    only when complete and verified. ``exists`` tells whether a destination is already current.
    """

    walk_apart = False  # walk a big tree in a process of its own (``bbstage.transfer.walkproc``)
    min_share = 0  # bytes: a share of one file split across nodes is at least this big

    def __init__(self, options: MoverOptions) -> None:
        self.options = options

    @abstractmethod
    def plan(self, src: str, dst: str, *, tree: bool, glob: bool) -> Iterable[FileTask]: ...

    @abstractmethod
    def copy(self, task: FileTask, progress: Progress, cancel: threading.Event) -> None: ...

    @abstractmethod
    def current(self, task: FileTask) -> bool | None:
        """True if ``task.dst`` already holds this file (never judged on size alone: size and
        the source's mtime, as rsync's quick check), False if it holds something else, None
        if it is absent. A True skips the copy (a resumed transfer does not copy again)."""

    def newer(self, task: FileTask) -> bool:
        """Is ``task.dst`` at least as new as the source (``overwrite=newer`` keeps it)?
        Local destinations by their mtime; other backends override."""
        try:
            return os.stat(task.dst).st_mtime_ns >= (task.mtime_ns or 0)
        except OSError:
            return False

    def streams(self, tasks: Sequence[FileTask]) -> int:
        """How many files to copy at once, judged from the first ``tasks`` of the plan
        (the worker does not hold the whole plan): ``options.threads`` unless the mover knows
        better for its storage."""
        return self.options.threads

    def prefetch(self, task: FileTask) -> None:  # noqa: B027 - optional hook
        """Start reading ``task``'s source ahead of its copy (a hint; errors are ignored).

        The worker calls it from one thread, a bounded window ahead of the copying threads,
        so that many small files' reads are in flight at once instead of one per thread.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def remove_temps(self, parent: str, stale: Callable[[str], bool]) -> int:
        """Remove from ``parent``, a store's directory, the temporary files whose names
        ``stale`` picks (a killed attempt's); how many. For a store whose uploads go under
        temporary names (``temp_name``) and are renamed into place; local directories are
        swept by ``planning.remove_stale_temps``, and a store that puts an object whole
        leaves none."""
        return 0

    def copy_range(
        self,
        task: FileTask,
        fd: int,
        offset: int,
        count: int,
        progress: Progress,
        cancel: threading.Event,
    ) -> None:
        """Write the ``count`` bytes at ``offset`` of ``task``'s source at the same offset of
        ``fd`` (one file written by several nodes: ``bbstage.transfer.ranges``), all of them or
        raise. Optional: movers to a local destination implement it."""
        raise TransferError(f"{type(self).__name__} does not copy byte ranges")

    def copy_share(
        self, task: FileTask, job_id: str, shard: Any, progress: Progress, cancel: threading.Event
    ) -> None:
        """Copy range ``shard`` (a ``bbstage.transfer.FileRange``) of one file, for
        destinations that assemble a file themselves (S3: pieces, joined on the server).
        Optional: local destinations use ``copy_range`` and ``bbstage.transfer.ranges`` instead."""
        raise TransferError(f"{type(self).__name__} does not copy shares of a file")

    def copy_many(
        self,
        tasks: list[FileTask],
        progress: Progress,
        cancel: threading.Event,
        done: Callable[[FileTask], None],
    ) -> dict[FileTask, TransferError]:
        """Copy a batch of the plan (its directories first) with the mover's own concurrency
        (e.g. many S3 requests in flight on one event loop); call ``done(task)`` after each
        file or link is in place; return the entries that failed, stopping early at a permanent
        error.
        Bytes reported through ``progress`` for a failed entry are taken back (negative add).

        Optional: the worker uses it instead of its own threads over ``copy`` when a mover
        overrides it, in batches of up to ``worker.BATCH`` entries in plan order (one call for a
        smaller plan). This default copies one entry after another."""
        failed: dict[FileTask, TransferError] = {}
        for task in tasks:
            if cancel.is_set():
                raise Cancelled()
            try:
                self.copy(task, progress, cancel)
            except TransferError as exc:
                failed[task] = exc
                if exc.permanent:
                    break
            else:
                done(task)
        return failed
