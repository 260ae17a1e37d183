"""Transfers, run in a worker process that has dropped to the job owner's identity.

The parent (``bbstage.daemon.executor``) sends a ``TransferSpec``; the worker walks the source in
one thread (a big POSIX tree in a process of its own, ``bbstage.transfer.walkproc``), a bounded
window ahead of the threads that copy many files (or the chunks of one big file)
concurrently, so memory does not grow with the number of files; it reports events
over a pipe (``bbstage.transfer``): ``Planned`` as the walk goes and ``final`` when it ends,
``Moved`` now and then, ``TempFile``/``TempsSettled``, then one of ``Done`` (the manifest:
what it committed, counted file by file) or ``Failed``. Then it waits for the next spec of
the same user (a new process costs more than a small transfer does).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from multiprocessing import forkserver, resource_tracker
from multiprocessing.connection import Connection
from typing import Any, Protocol

from bbstage import movers
from bbstage.identity import Identity, user_env
from bbstage.movers import FileTask, Mover, MoverOptions, TransferError, localfs, retrying
from bbstage.transfer import (
    Done,
    Event,
    Failed,
    FileRange,
    Moved,
    Planned,
    TempFile,
    TempsSettled,
    TransferSpec,
    codec,
    planning,
    ranges,
    transfer_env,
    walkproc,
)

_REPORT_EVERY = 0.25
IDLE_EXIT = 120.0  # a worker left idle this long exits (the executor retires it sooner)
READ_AHEAD_FILES = 2048  # the walk (and its prefetch) runs at most this far ahead of the copy
READ_AHEAD_BYTES = 128 << 20
BATCH = 10_000  # entries per ``Mover.copy_many`` call
SETTLE_BATCH = 1024  # settled temporary files sent at once (at least every _REPORT_EVERY)
_WATCH_EVERY = 0.5  # seconds between checks that the daemon still runs


class Sink(Protocol):
    """Where a worker's events go: the pipe to the executor, or a stand-in (the Dask
    child's lines in dask_task.py, tests)."""

    def send(self, event: Event) -> None: ...


class Reporter:
    """Thread-safe progress sink that batches reports to the parent, and keeps the manifest:
    the files committed and their bytes, counted apart from the movers' progress."""

    def __init__(self, conn: Sink) -> None:
        self._conn, self._lock = conn, threading.Lock()
        self.bytes = 0  # reported by the movers as they copy
        self.committed = Done(0, 0)
        self._last = time.monotonic()  # the first report after _REPORT_EVERY
        self._temps: dict[str, list[str]] = {}  # destination -> its temporary files in use
        self._settled: list[str] = []  # renamed or removed, not yet told

    def send(self, event: Any) -> None:
        with self._lock:
            self._conn.send(event)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.bytes += nbytes
            self._maybe_report()

    def file_done(self, task: FileTask, seconds: float | None = None) -> None:
        """``task`` is in place, verified; ``seconds`` it took (``bbstage bench``). Its
        temporary files (this attempt's and failed ones') are gone: renamed or removed."""
        with self._lock:
            self.committed = Done(self.committed.bytes + task.size, self.committed.files + 1)
            settled = self._temps.pop(localfs.temp_key(task.dst), None)
            if settled:
                self._settled += settled
                if len(self._settled) >= SETTLE_BATCH:
                    self._send_settled()
            self._maybe_report()

    def range_done(self, task: FileTask, nbytes: int, files: int) -> None:
        """A share's byte range of ``task``'s file is written (``bbstage.transfer.ranges``): its
        bytes, and the file itself for share 0 (so the shares' manifests add up to one
        file). Its temporary files are no longer this share's: its siblings' or renamed."""
        with self._lock:
            self.committed = Done(self.committed.bytes + nbytes, self.committed.files + files)
            self._settled += self._temps.pop(localfs.temp_key(task.dst), [])

    def temp(self, path: str) -> None:
        """Tell the executor of a temporary file before the mover creates it."""
        with self._lock:
            self._conn.send(TempFile(path))
            self._temps.setdefault(localfs.temp_owner(path), []).append(path)

    def _send_settled(self) -> None:
        if self._settled:
            self._conn.send(TempsSettled(tuple(self._settled)))
            self._settled = []

    def _maybe_report(self) -> None:
        now = time.monotonic()
        if now - self._last >= _REPORT_EVERY:
            self._last = now
            self._send_settled()
            self._conn.send(Moved(self.bytes, self.committed.files))

    def flush(self) -> None:
        with self._lock:
            self._send_settled()
            self._conn.send(Moved(self.bytes, self.committed.files))


def serve(conn: Connection, identity: Identity, daemon: int | None = None) -> None:
    """Process entry point: drop privileges for good, then run the transfers the parent sends,
    one at a time, until it sends ``None``, closes the pipe, or sends nothing for
    ``IDLE_EXIT`` seconds. SIGTERM cancels the running transfer and ends the process; so
    does the end of the ``daemon`` process, if given."""
    _close_roots_pipes()
    cancel = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getpriority(os.PRIO_PROCESS, 0) < 0:
        # The daemon may run with a raised priority (Nice=-10) to answer hooks promptly;
        # copying never outranks the node's normal work.
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    pipe = codec.Pipe(conn)
    try:
        _become(identity)
    except Exception as exc:
        pipe.send(Failed(f"could not assume the job owner's identity: {exc}"))
        conn.close()
        return
    if daemon is not None:
        _die_with(daemon)
    try:
        while not cancel.is_set() and conn.poll(IDLE_EXIT):
            spec = conn.recv()
            if spec is None:
                return
            transfer(spec, Reporter(pipe), cancel)
            if cancel.is_set():
                return  # SIGTERM: the transfer was stopped; so is the process
    except (EOFError, OSError):
        pass  # the parent went away
    finally:
        conn.close()


def transfer(spec: TransferSpec, reporter: Reporter, cancel: threading.Event) -> None:
    """Run one transfer and send its outcome: ``Done`` with the manifest, or ``Failed``."""
    try:
        run(spec, reporter, cancel)
        if cancel.is_set():  # stopped between files: not every file may be in place
            raise movers.Cancelled()
        reporter.flush()
        reporter.send(reporter.committed)
    except TransferError as exc:
        reporter.send(Failed(str(exc), exc.permanent))
    except Exception as exc:  # a bug: report it rather than die silently
        reporter.send(Failed(f"internal error: {type(exc).__name__}: {exc}"))


def _close_roots_pipes() -> None:
    """Close the two pipes of root's that the forkserver hands every process it starts
    (CPython 3.11 ``forkserver._serve_one``), before this one runs anything as the user: the
    write end of root's resource tracker (a line there makes root unlink the shared memory or
    semaphore it names when the daemon exits) and of the forkserver's alive pipe (a byte
    there ends the forkserver). Should this process ever need a resource tracker, it starts
    its own, as the user."""
    tracker = resource_tracker._resource_tracker
    for fd in (tracker._fd, forkserver._forkserver._forkserver_alive_fd):  # type: ignore[attr-defined]
        if fd is not None:
            os.close(fd)
    tracker._fd = tracker._pid = None  # type: ignore[attr-defined]
    forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]


def _die_with(daemon: int) -> None:
    """End this process within ``_WATCH_EVERY`` seconds of the daemon's end: a worker left
    copying by a killed daemon would race the restarted daemon's attempt at the same files
    (its forkserver, our parent, outlives a SIGKILLed daemon, so PR_SET_PDEATHSIG cannot)."""

    def watch() -> None:
        while True:
            time.sleep(_WATCH_EVERY)
            try:
                os.kill(daemon, 0)
            except ProcessLookupError:
                os.kill(os.getpid(), signal.SIGKILL)  # temp files: the next attempt sweeps
            except PermissionError:
                pass  # alive (root's, and we are the user now)

    threading.Thread(target=watch, name="watch-daemon", daemon=True).start()


def _become(identity: Identity) -> None:
    """Assume the user's identity and environment: an allow-list (``identity.user_env``: PATH,
    the user's HOME, locale), never root's: no credentials of any backend's (AWS_*,
    GOOGLE_APPLICATION_CREDENTIALS, AZURE_*...) unless a backend asks for it by name."""
    identity.assume()
    transfer_env.remember()
    os.environ.clear()
    os.environ.update(user_env(identity.uid))


def run(spec: TransferSpec, reporter: Reporter, cancel: threading.Event) -> None:
    """Plan and copy one directive's data (in the current identity)."""
    if os.getuid() != 0:  # a worker, as the user (never root; in-process tests keep theirs)
        transfer_env.apply(spec.source_kind, spec.destination_kind)
    options = MoverOptions(
        job_id=spec.job_id,
        threads=spec.threads,
        chunk_size=spec.chunk_size,
        checksum=spec.checksum,
        source=spec.source_options,
        destination=spec.destination_options,
        source_kind=spec.source_kind,
        destination_kind=spec.destination_kind,
        wanted=planning.wanted(spec.part),
    )
    mover = movers.get(spec.source_kind, spec.destination_kind)(options)
    try:
        tasks = planning.plan(mover, spec, cancel)
        again = isinstance(tasks, Sequence)  # a list is read again; a walk is started anew
        budget = None
        if isinstance(spec.part, FileRange):
            return _copy_range(mover, list(tasks), spec.part, spec, reporter, cancel)
        # First passes, before anything is copied; they keep counts, never the plan.
        if spec.resumed:
            planning.remove_stale_temps(mover, tasks, spec.job_id, spec.part)
            tasks = tasks if again else planning.plan(mover, spec, cancel)
        if spec.scratch_limit is not None:  # the whole tree must fit, whichever the shard
            chosen = planning.select(mover, tasks, spec.overwrite)
            budget = planning.check_capacity(chosen, spec.scratch_limit)
            tasks = tasks if again else planning.plan(mover, spec, cancel)
        chosen = planning.chosen(mover, tasks, spec)
        apart = None
        if walkproc.wanted(mover, spec):  # its process plans and selects on its own
            apart = walkproc.WalkRequest(spec, options, budget, READ_AHEAD_FILES, READ_AHEAD_BYTES)
        _copy_all(mover, chosen, reporter, cancel, None, budget, apart)
    finally:
        mover.close()


def _copy_range(
    mover: Mover,
    plan: list[FileTask],
    part: FileRange,
    spec: TransferSpec,
    reporter: Reporter,
    cancel: threading.Event,
) -> None:
    """Range ``part`` of a one-file transfer: its bytes of a file of at least ``min_size``
    bytes (``bbstage.transfer.ranges``; to a store that assembles pieces: ``copy_share``); anything
    else (a smaller file, a link, a file already in place, a transfer with ``checksum=``)
    range 0 copies whole, alone."""
    if spec.resumed:
        planning.remove_stale_temps(mover, plan, spec.job_id, part)
    chosen = list(planning.select(mover, plan, spec.overwrite))
    if spec.scratch_limit is not None:
        planning.check_capacity(chosen, spec.scratch_limit)
    task = chosen[0] if len(chosen) == 1 else None
    least = max(part.min_size, mover.min_share * part.count)
    if task is None or task.kind != "file" or task.size < least or spec.checksum != "none":
        if part.index == 0:
            return _copy_all(mover, chosen, reporter, cancel)
        reporter.send(Planned(0, 0))
        return
    offset, count = ranges.span(part, task.size)
    files = 1 if part.index == 0 else 0
    reporter.send(Planned(count, files))

    def copy(fd: int, start: int, n: int) -> None:
        retrying.FILE.run(lambda: mover.copy_range(task, fd, start, n, reporter, cancel), cancel)

    if movers.backend(spec.destination_kind).assembles_pieces:  # joined by the last range
        mover.copy_share(task, spec.job_id, part, reporter, cancel)
    else:
        ranges.write_range(task, spec.job_id, part, copy, reporter.temp)
    reporter.range_done(task, count, files)


def _copy_all(
    mover: Mover,
    tasks: Iterable[FileTask],
    reporter: Reporter,
    cancel: threading.Event,
    threads: int | None = None,
    budget: int | None = None,
    apart: walkproc.WalkRequest | None = None,
) -> None:
    """Copy the plan as it is walked (``planning.Walk``; with ``apart``, in the walk's
    process, ``walkproc.WalkApart``, which plans on its own, ``tasks`` unread): directories
    by the walk, in order, before anything in them; files and links by ``threads`` threads
    (None: ``mover.streams`` of the first chunk) taking them one at a time, each chunk
    interleaved across directories when several threads copy (concurrent creates in one
    directory wait on its lock). A mover with its own concurrency (``copy_many``) gets
    batches of up to ``BATCH`` entries. The first failure cancels the rest and is raised."""
    batched = type(mover).copy_many is not Mover.copy_many

    def make_dir(task: FileTask) -> None:
        retrying.FILE.run(lambda: mover.copy(task, reporter, cancel), cancel)

    walk: planning.Walk | walkproc.WalkApart
    if apart is not None:
        walk = walkproc.WalkApart(apart, reporter.send)
    else:
        walk = planning.Walk(
            mover,
            tasks,
            reporter.send,
            cancel,
            make_dir=None if batched else make_dir,
            budget=budget,
            files_ahead=READ_AHEAD_FILES,
            bytes_ahead=READ_AHEAD_BYTES,
        )
    with walk:
        chunks = walk.chunks()
        if batched:
            return _copy_batched(mover, chunks, reporter, cancel)
        first = next(chunks, [])
        if threads is None:
            threads = mover.streams(first)
        _copy_threads(mover, itertools.chain([first], chunks), reporter, cancel, threads)


def _copy_threads(
    mover: Mover,
    chunks: Iterator[list[FileTask]],
    reporter: Reporter,
    cancel: threading.Event,
    threads: int,
) -> None:
    lock = threading.Lock()
    current: list[Iterator[FileTask]] = [iter(())]
    failures: list[BaseException] = []

    def take() -> FileTask | None:
        with lock:
            while True:
                task = next(current[0], None)
                if task is not None:
                    return task
                chunk = next(chunks, None)  # raises the walk's error, in one copying thread
                if chunk is None:
                    return None
                current[0] = iter(_interleave(chunk) if threads > 1 else chunk)

    def drain() -> None:
        while not failures:
            try:
                task = take()
                if task is None:
                    return
                started = time.perf_counter()
                retrying.FILE.run(lambda t=task: mover.copy(t, reporter, cancel), cancel)
                if task.kind == "file":
                    reporter.file_done(task, time.perf_counter() - started)
            except BaseException as exc:
                failures.append(exc)
                cancel.set()
                return

    helpers = [
        threading.Thread(target=drain, name=f"file-{i}", daemon=True)
        for i in range(max(1, threads) - 1)
    ]
    for thread in helpers:
        thread.start()
    try:
        drain()  # this thread is one of the workers
    finally:
        for thread in helpers:
            thread.join()
    if failures:
        raise failures[0]


def _interleave(tasks: list[FileTask]) -> list[FileTask]:
    """Round-robin over destination directories, keeping each directory's order."""
    groups: dict[str, list[FileTask]] = {}
    for task in tasks:
        groups.setdefault(os.path.dirname(task.dst), []).append(task)
    if len(groups) < 2:
        return tasks
    return [t for row in itertools.zip_longest(*groups.values()) for t in row if t is not None]


def _copy_batched(
    mover: Mover,
    chunks: Iterator[list[FileTask]],
    reporter: Reporter,
    cancel: threading.Event,
) -> None:
    """Hand the plan to the mover's ``copy_many`` in batches of up to ``BATCH`` entries;
    retry each batch's transient failures."""
    batch: list[FileTask] = []
    for chunk in chunks:
        batch += chunk
        if len(batch) >= BATCH:
            _copy_batch(mover, batch, reporter, cancel)
            batch = []
    if batch:
        _copy_batch(mover, batch, reporter, cancel)


def _copy_batch(
    mover: Mover, tasks: list[FileTask], reporter: Reporter, cancel: threading.Event
) -> None:
    def done(task: FileTask) -> None:
        if task.kind == "file":
            reporter.file_done(task)

    waits = retrying.FILE.waits()  # the batch is one step: its failed entries are tried again
    while True:
        failed = mover.copy_many(tasks, reporter, cancel, done)
        if not failed:
            return
        errors = list(failed.values())
        permanent = [e for e in errors if e.permanent]
        delay = next(waits, None)
        if permanent or delay is None or cancel.is_set():
            raise (permanent or errors)[0]
        if cancel.wait(delay):
            raise movers.Cancelled()
        tasks = list(failed)
