"""Transfers, run in a worker process that has dropped to the job owner's identity.

The parent (``bbstage.executor``) sends a ``TransferSpec``; the worker plans the copy, copies
many files (or the chunks of one big file) concurrently, and reports events over a pipe
(``bbstage.transfer``): ``Planned``, ``Moved`` now and then, ``TempFile``, then one of
``Done`` (the manifest: what it committed, counted file by file) or ``Failed``. Then it waits
for the next spec of the same user (a new process costs more than a small transfer does).
"""

from __future__ import annotations

import itertools
import os
import pwd
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from bbstage import movers
from bbstage.identity import Identity
from bbstage.movers import FileTask, Mover, MoverOptions, TransferError, localfs
from bbstage.transfer import Done, Failed, Moved, Planned, ScratchLimit, TempFile, TransferSpec

RETRIES = 5
BACKOFF_CAP = 8.0
_REPORT_EVERY = 0.25
IDLE_EXIT = 120.0  # a worker left idle this long exits (the executor retires it sooner)
READ_AHEAD_FILES = 2048
READ_AHEAD_BYTES = 128 << 20
_WATCH_EVERY = 0.5  # seconds between checks that the daemon still runs


class _Reporter:
    """Thread-safe progress sink that batches reports to the parent, and keeps the manifest:
    the files committed and their bytes, counted apart from the movers' progress."""

    def __init__(self, conn: Connection) -> None:
        self._conn, self._lock = conn, threading.Lock()
        self.bytes = 0  # reported by the movers as they copy
        self.committed = Done(0, 0)
        self._last = time.monotonic()  # the first report after _REPORT_EVERY

    def send(self, event: Any) -> None:
        with self._lock:
            self._conn.send(event)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.bytes += nbytes
            self._maybe_report()

    def file_done(self, task: FileTask, seconds: float | None = None) -> None:
        """``task`` is in place, verified; ``seconds`` it took (``bbstage bench``)."""
        with self._lock:
            self.committed = Done(self.committed.bytes + task.size, self.committed.files + 1)
            self._maybe_report()

    def temp(self, path: str) -> None:
        self.send(TempFile(path))

    def _maybe_report(self) -> None:
        now = time.monotonic()
        if now - self._last >= _REPORT_EVERY:
            self._last = now
            self._conn.send(Moved(self.bytes, self.committed.files))

    def flush(self) -> None:
        self.send(Moved(self.bytes, self.committed.files))


def serve(conn: Connection, identity: Identity, daemon: int | None = None) -> None:
    """Process entry point: drop privileges for good, then run the transfers the parent sends,
    one at a time, until it sends ``None``, closes the pipe, or sends nothing for
    ``IDLE_EXIT`` seconds. SIGTERM cancels the running transfer and ends the process; so
    does the end of the ``daemon`` process, if given."""
    cancel = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getpriority(os.PRIO_PROCESS, 0) < 0:
        # The daemon may run with a raised priority (Nice=-10) to answer hooks promptly;
        # copying never outranks the node's normal work.
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    try:
        _become(identity)
    except Exception as exc:
        conn.send(Failed(f"could not assume the job owner's identity: {exc}"))
        conn.close()
        return
    if daemon is not None:
        _die_with(daemon)
    try:
        while not cancel.is_set() and conn.poll(IDLE_EXIT):
            spec = conn.recv()
            if spec is None:
                return
            _transfer(spec, _Reporter(conn), cancel)
            if cancel.is_set():
                return  # SIGTERM: the transfer was stopped; so is the process
    except (EOFError, OSError):
        pass  # the parent went away
    finally:
        conn.close()


def _transfer(spec: TransferSpec, reporter: _Reporter, cancel: threading.Event) -> None:
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
    """Assume the user's identity and environment: their HOME, none of root's credentials."""
    identity.assume()
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        del os.environ[name]
    try:
        os.environ["HOME"] = pwd.getpwuid(identity.uid).pw_dir
    except KeyError:
        os.environ.pop("HOME", None)


def run(spec: TransferSpec, reporter: _Reporter, cancel: threading.Event) -> None:
    """Plan and copy one directive's data (in the current identity)."""
    options = MoverOptions(
        job_id=spec.job_id,
        threads=spec.threads,
        chunk_size=spec.chunk_size,
        checksum=spec.checksum,
        extra=dict(spec.extra),
    )
    mover = movers.get(spec.source_kind, spec.destination_kind)(options)
    try:
        tasks = _with_retries(
            lambda: mover.plan(spec.source, spec.destination, tree=spec.tree, glob=spec.glob),
            cancel,
        )
        if spec.resumed:
            remove_stale_temps(tasks, spec.job_id)
        tasks = _select(mover, tasks, spec.overwrite)
        if spec.scratch_limit is not None:
            _check_capacity(tasks, spec.scratch_limit)
        files = [t for t in tasks if t.kind == "file"]
        reporter.send(Planned(sum(t.size for t in files), len(files)))
        _copy_all(mover, tasks, reporter, cancel, mover.streams(tasks))
    finally:
        mover.close()


def _select(mover: Mover, tasks: list[FileTask], overwrite: str) -> list[FileTask]:
    """Drop what is already in place, and existing files the ``overwrite`` rule keeps:
    ``never`` keeps every existing file, ``newer`` one at least as new as its source."""
    chosen = []
    for task in tasks:
        state = mover.current(task)
        if state is True:
            continue  # already staged (e.g. before a daemon restart)
        if state is False and task.kind == "file":
            if overwrite == "never" or (overwrite == "newer" and mover.newer(task)):
                continue
        chosen.append(task)
    return chosen


def _check_capacity(tasks: list[FileTask], limit: ScratchLimit) -> None:
    """Refuse before copying what would not fit in the job's scratch capacity."""
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


def _copy_all(
    mover: Mover,
    tasks: list[FileTask],
    reporter: _Reporter,
    cancel: threading.Event,
    threads: int,
) -> None:
    """Directories first (in order), then files and links: ``threads`` threads take them one
    at a time from a shared list, interleaved across directories (concurrent creates in one
    directory wait on its lock), while one more thread has the mover read ahead of them
    (``Mover.prefetch``); the first failure cancels the rest and is raised."""
    if type(mover).copy_many is not Mover.copy_many:
        return _copy_batched(mover, tasks, reporter, cancel)
    for task in tasks:
        if task.kind == "dir":
            mover.copy(task, reporter, cancel)
    work = [t for t in tasks if t.kind != "dir"]
    if threads > 1:
        work = _interleave(work)
    taken = itertools.count()  # next() on it is atomic: no lock, no future per file
    cursor = [0]  # the index the copying threads have reached (read by the read-ahead)
    failures: list[BaseException] = []

    def drain() -> None:
        while not failures:
            i = next(taken)
            if i >= len(work):
                return
            cursor[0] = i
            task = work[i]
            try:
                started = time.perf_counter()
                _with_retries(lambda t=task: mover.copy(t, reporter, cancel), cancel)
                if task.kind == "file":
                    reporter.file_done(task, time.perf_counter() - started)
            except BaseException as exc:
                failures.append(exc)
                cancel.set()
                return

    finished = threading.Event()
    helpers = [
        threading.Thread(target=drain, name=f"file-{i}", daemon=True)
        for i in range(min(max(1, threads), len(work)) - 1)
    ]
    if len(work) > 1 and type(mover).prefetch is not Mover.prefetch:
        helpers.append(
            threading.Thread(
                target=_read_ahead,
                args=(mover, work, cursor, finished),
                name="read-ahead",
                daemon=True,
            )
        )
    for thread in helpers:
        thread.start()
    try:
        drain()  # this thread is one of the workers
    finally:
        finished.set()
        for thread in helpers:
            thread.join()
    if failures:
        raise failures[0]


def _read_ahead(
    mover: Mover, work: list[FileTask], cursor: list[int], finished: threading.Event
) -> None:
    """Call ``mover.prefetch`` on each entry in copy order, at most ``READ_AHEAD_FILES``
    entries and ``READ_AHEAD_BYTES`` ahead of the copying threads (the page cache must
    still hold what was read when its copy comes)."""
    offsets = list(itertools.accumulate((t.size for t in work), initial=0))
    for i, task in enumerate(work):
        while i - cursor[0] > READ_AHEAD_FILES or (
            offsets[i] - offsets[cursor[0]] > READ_AHEAD_BYTES
        ):
            if finished.wait(0.002):
                return
        if finished.is_set():
            return
        mover.prefetch(task)


def _interleave(tasks: list[FileTask]) -> list[FileTask]:
    """Round-robin over destination directories, keeping each directory's order."""
    groups: dict[str, list[FileTask]] = {}
    for task in tasks:
        groups.setdefault(os.path.dirname(task.dst), []).append(task)
    if len(groups) < 2:
        return tasks
    return [t for row in itertools.zip_longest(*groups.values()) for t in row if t is not None]


def _copy_batched(
    mover: Mover, tasks: list[FileTask], reporter: _Reporter, cancel: threading.Event
) -> None:
    """Hand the whole plan to the mover's ``copy_many``; retry its transient failures."""

    def done(task: FileTask) -> None:
        if task.kind == "file":
            reporter.file_done(task)

    delay = 0.2
    for attempt in range(RETRIES + 1):
        failed = mover.copy_many(tasks, reporter, cancel, done)
        if not failed:
            return
        errors = list(failed.values())
        permanent = [e for e in errors if e.permanent]
        if permanent or attempt == RETRIES or cancel.is_set():
            raise (permanent or errors)[0]
        if cancel.wait(delay):
            raise movers.Cancelled()
        delay = min(delay * 2, BACKOFF_CAP)
        tasks = list(failed)


def _with_retries(action: Any, cancel: threading.Event) -> Any:
    """Run ``action``; retry transient errors with capped exponential backoff."""
    delay = 0.2
    for attempt in range(RETRIES + 1):
        try:
            return action()
        except (TransferError, OSError) as exc:
            err = exc if isinstance(exc, TransferError) else movers.base.os_error(exc)
            if err.permanent or attempt == RETRIES or cancel.is_set():
                raise err from None
        if cancel.wait(delay):
            raise movers.Cancelled()
        delay = min(delay * 2, BACKOFF_CAP)


def remove_stale_temps(tasks: list[FileTask], job_id: str) -> int:
    """Remove the temporary files an earlier, killed attempt of this job left in the
    local destination directories of ``tasks`` (as the user); how many were removed."""
    pattern, removed = localfs.temp_pattern(job_id), 0
    for parent in {os.path.dirname(t.dst) for t in tasks if not t.dst.startswith("s3://")}:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            if pattern.match(name):
                try:
                    os.unlink(os.path.join(parent, name))
                    removed += 1
                except OSError:
                    pass
    return removed


def cleanup(paths: list[str], identity: Identity) -> None:
    """Remove temporary files left by a killed worker, as the user who wrote them."""
    identity.assume()
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
