"""A transfer's plan, streamed: what to copy (``select``), the first passes a resumed or
capacity-bound transfer makes before copying (``remove_stale_temps``, ``check_capacity``),
and the walk that hands the plan to the copying threads a bounded window ahead of them
(``Walk``). None of them holds the plan: memory does not grow with the number of files."""

from __future__ import annotations

import functools
import os
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator

from bbstage.movers import FileTask, Mover, TransferError, counts, localfs, retrying
from bbstage.transfer import FileRange, Planned, ScratchLimit, TransferSpec, TreeShard


def plan(mover: Mover, spec: TransferSpec, cancel: threading.Event) -> Iterable[FileTask]:
    """The mover's plan of ``spec`` (a list, or a lazy walk read once); transient errors
    retried."""
    return retrying.FILE.run(  # type: ignore[no-any-return]
        lambda: mover.plan(spec.source, spec.destination, tree=spec.tree, glob=spec.glob),
        cancel,
    )


def in_shard(dst: str, shard: TreeShard) -> bool:
    """Whether the file at ``dst`` belongs to ``shard`` (a stable hash of the path)."""
    return zlib.crc32(os.fsencode(dst)) % shard.count == shard.index


def wanted(shard: TreeShard | FileRange | None) -> Callable[[str], bool] | None:
    """The files ``only`` keeps, by destination, for a mover that need not ask about the
    rest (``MoverOptions.wanted``); None: all."""
    if not isinstance(shard, TreeShard) or shard.count == 1:
        return None
    return functools.partial(in_shard, shard=shard)


def only(tasks: Iterable[FileTask], shard: TreeShard | FileRange | None) -> Iterable[FileTask]:
    """The plan of one shard of a tree: every directory (each shard makes the ones it walks),
    and the files and links of the shard (all of them for anything but a ``TreeShard``)."""
    keep = wanted(shard)
    if keep is None:
        return tasks
    return (t for t in tasks if t.kind == "dir" or keep(t.dst))


PROBE_ENTRIES = 10_000  # ``below`` gives up (says no) after looking at this many entries


def below(path: str, tree: bool, limit: int) -> bool:
    """Does the local source at ``path`` (a file, or a tree) hold fewer than ``limit``
    bytes, as this host sees it? No if it cannot tell (unreadable, or more than
    ``PROBE_ENTRIES`` entries). A hint for how to split a transfer, never for what to copy."""
    try:
        if not tree:
            return os.stat(path).st_size < limit
        total = 0
        for seen, entry in enumerate(entries(path), 1):
            if not entry.is_dir(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
            if total >= limit or seen > PROBE_ENTRIES:
                return False
        return True
    except OSError:
        return False


def entries(root: str) -> Iterator[os.DirEntry[str]]:
    """Every entry under the directory ``root``, depth first, links not followed (for a
    count or a hint: no ``stat`` unless the caller asks one); raises ``OSError``."""
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as found:
            for entry in found:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                yield entry


def chosen(mover: Mover, tasks: Iterable[FileTask], spec: TransferSpec) -> Iterator[FileTask]:
    """What of the plan ``tasks`` ``spec`` copies: its shard's share (``only``), less what
    is in place or kept (``select``). The worker's walk and the walk's process both ask."""
    return select(mover, only(tasks, spec.part), spec.overwrite)


def select(mover: Mover, tasks: Iterable[FileTask], overwrite: str) -> Iterator[FileTask]:
    """Drop what is already in place, and existing files the ``overwrite`` rule keeps:
    ``never`` keeps every existing file, ``newer`` one at least as new as its source.

    A directory found absent has nothing in it: its entries are not looked up one by one
    (a fresh destination costs no lookup per file). Only the directories whose entries
    have not started are remembered (a walk hands each directory's entries on together)."""
    absent: set[str] = set()  # directories found absent, whose entries may still come
    parent = None
    for task in tasks:
        if task.kind == "special":
            yield task  # never copied: the walk counts it (``Walk``)
            continue
        here = os.path.dirname(task.dst)
        if here != parent:
            absent.discard(parent)  # type: ignore[arg-type]
            parent = here
        if here in absent:
            if task.kind == "dir":
                absent.add(task.dst)
            yield task
            continue
        state = mover.current(task)
        if state is None and task.kind == "dir":
            absent.add(task.dst)
        if state is True:
            continue  # already staged (e.g. before a daemon restart)
        if state is False and task.kind == "file":
            if overwrite == "never" or (overwrite == "newer" and mover.newer(task)):
                continue
        yield task


def check_capacity(tasks: Iterable[FileTask], limit: ScratchLimit) -> int:
    """Refuse before copying what would not fit in the job's scratch capacity; the bytes
    the copy may still add (the walk that copies stops there, should the tree grow)."""
    path, capacity = limit.path, limit.capacity
    used = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                used += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    needed = sum(t.size for t in tasks)
    if used + needed > capacity:
        raise TransferError(
            f"does not fit in $BB_SCRATCH: needs {needed} bytes, {used} of capacity={capacity}"
            " are used; ask for a larger #BB_LUA capacity="
        )
    return capacity - used


_END = None  # after the last chunk
WINDOWS = 16  # the read-ahead window, in chunks handed from the walk to the copy
REPORT_EVERY = 0.25  # seconds between the counts sent while walking


class Walk:
    """The plan, read by its own thread and handed to the copying threads in chunks through
    a bounded queue: the walk runs at most ``files_ahead`` files (and about ``bytes_ahead``
    bytes) ahead of the copy. On the way it creates directories (``make_dir``, before
    anything in them is handed on), has the mover read files ahead (``Mover.prefetch``),
    counts what it handed on, and sends it (``send``) as ``Planned``: the counts so far
    now and then, the final ones when the walk has ended — before the end of the queue,
    so before the copy can end and the worker send ``Done``. ``budget``: the bytes the
    plan may reach (scratch capacity left); a source that grows past it fails the walk."""

    def __init__(
        self,
        mover: Mover,
        tasks: Iterable[FileTask],
        send: Callable[[Planned], None],
        cancel: threading.Event,
        *,
        make_dir: Callable[[FileTask], None] | None,
        budget: int | None,
        files_ahead: int,
        bytes_ahead: int,
    ) -> None:
        self.mover, self.tasks, self.send, self.cancel = mover, tasks, send, cancel
        self.make_dir, self.budget = make_dir, budget
        self.prefetch = type(mover).prefetch is not Mover.prefetch
        self.chunk_files = max(1, files_ahead // WINDOWS)
        self.chunk_bytes = max(1, bytes_ahead // WINDOWS)
        # The copy holds one chunk, the walk fills one: WINDOWS chunks ahead in all.
        self.queue: queue.Queue[list[FileTask] | None] = queue.Queue(WINDOWS - 2)
        self.stop = threading.Event()  # the copy has ended (or failed): stop walking
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="walk", daemon=True)

    def __enter__(self) -> Walk:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def chunks(self) -> Iterator[list[FileTask]]:
        """The chunks in plan order; raises the walk's error where it happened."""
        while True:
            chunk = self.queue.get()
            if chunk is _END:
                if self.error is not None:
                    raise self.error
                return
            yield chunk

    def _run(self) -> None:
        try:
            self.walk()
        except BaseException as exc:
            self.error = exc
        self.hand_on(_END, force=True)

    def walk(self) -> None:
        """Read the plan and hand it on (``hand_on``), making directories on the way."""
        files = nbytes = chunk_bytes = skipped = 0
        chunk: list[FileTask] = []
        last = time.monotonic()
        for task in self.tasks:
            if self.stop.is_set() or self.cancel.is_set():
                return  # no final Planned: the transfer did not finish
            if task.kind == "special":  # a FIFO, socket or device: skipped, counted
                skipped += 1
                continue
            if task.kind == "dir" and self.make_dir is not None:
                self.make_dir(task)
                continue
            if task.kind == "file":
                files, nbytes = files + 1, counts.total(nbytes + task.size, task.src)
                if self.budget is not None and nbytes > self.budget:
                    raise TransferError(
                        "does not fit in $BB_SCRATCH: the source grew while it was staged,"
                        f" past the {self.budget} bytes left of its capacity="
                    )
                chunk_bytes += task.size
            if self.prefetch:
                self.mover.prefetch(task)
            chunk.append(task)
            if len(chunk) >= self.chunk_files or chunk_bytes >= self.chunk_bytes:
                if not self.hand_on(chunk):
                    return
                chunk, chunk_bytes = [], 0
                if time.monotonic() - last >= REPORT_EVERY:
                    last = time.monotonic()
                    self.send(Planned(nbytes, files, final=False, skipped=skipped))
        if chunk and not self.hand_on(chunk):
            return
        self.send(Planned(nbytes, files, skipped=skipped))

    def hand_on(self, chunk: list[FileTask] | None, force: bool = False) -> bool:
        """Hand ``chunk`` on, waiting for room; False if the copy ended first. ``force``
        (the end mark) makes room if the copy no longer reads."""
        while True:
            try:
                self.queue.put(chunk, timeout=0.05)
                return True
            except queue.Full:
                if not force and self.stop.is_set():
                    return False
                if force and self.stop.is_set():
                    try:
                        self.queue.get_nowait()
                    except queue.Empty:
                        pass


def remove_stale_temps(
    mover: Mover,
    tasks: Iterable[FileTask],
    job_id: str,
    part: TreeShard | FileRange | None = None,
) -> int:
    """Remove the temporary files an earlier, killed attempt of this job left in the
    destination directories of ``tasks`` (as the user: local ones here, a store's through
    ``mover.remove_temps``); how many were removed.
    With a ``TreeShard``, only those of its files (other shards may be copying beside it);
    with a ``FileRange``, all but those of its group (its siblings' file).
    Each directory is read once per run of its entries (a walk keeps a directory's
    entries together), so nothing grows with the number of files."""
    pattern, removed, last = localfs.temp_pattern(job_id), 0, None
    for task in tasks:
        parent = os.path.dirname(task.dst)
        if parent == last:
            continue
        last = parent
        if "://" in task.dst:  # a store's directory

            def stale(name: str, parent: str = parent) -> bool:
                return bool(pattern.match(name)) and _stale(os.path.join(parent, name), part)

            removed += mover.remove_temps(parent, stale)
            continue
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            path = os.path.join(parent, name)
            if pattern.match(name) and _stale(path, part):
                try:
                    os.unlink(path)
                    removed += 1
                except OSError:
                    pass
    return removed


def _stale(path: str, part: TreeShard | FileRange | None) -> bool:
    """Is this job's temporary file ``path`` one ``part``'s sweep removes?"""
    if part is None:
        return True
    if isinstance(part, FileRange):
        return f"-{part.group}." not in os.path.basename(path)
    return in_shard(localfs.temp_owner(path), part)
