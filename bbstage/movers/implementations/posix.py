"""POSIX to POSIX (and scratch): ``copy_file_range`` in the kernel, big files in parallel chunks."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from bbstage.movers import localfs
from bbstage.movers.backends import Backend
from bbstage.movers.base import (
    BackendOptions,
    Cancelled,
    FileTask,
    Mover,
    Progress,
    TransferError,
)
from bbstage.movers.checksum import verify

_STEP = 16 << 20  # bytes per copy_file_range call, and per progress report
_PREFETCH_MAX = 1 << 20  # bigger files get the kernel's sequential readahead instead


class PosixMover(Mover):
    walk_apart = True  # every file costs system calls: the walk's apart from the copy's GIL

    def plan(self, src: str, dst: str, *, tree: bool, glob: bool) -> Iterator[FileTask]:
        return localfs.plan_local(src, dst, tree=tree, glob=glob)

    def current(self, task: FileTask) -> bool | None:
        return localfs.current(task)

    def streams(self, tasks: Sequence[FileTask]) -> int:
        """One stream when source and destination are both on local block devices: there
        every create goes through one journal and parallel threads only contend (one thread
        fed by ``prefetch`` beat 8: docs/performance.md, "POSIX staging").
        Network and parallel file systems (no block device: NFS, Lustre, GPFS, ...) hide
        their round trips behind ``options.threads`` streams."""
        first = next((t for t in tasks if t.kind == "file"), None)
        if first is None or self.options.threads < 2:
            return self.options.threads
        if _on_block_device(first.src) and _on_block_device(os.path.dirname(first.dst)):
            return 1
        return self.options.threads

    def prefetch(self, task: FileTask) -> None:
        """Ask the kernel to read a small file now (``POSIX_FADV_WILLNEED`` does not wait):
        with a cold cache this turns one read per file in turn into a deep, merged queue."""
        if task.kind != "file" or task.size > _PREFETCH_MAX:
            return
        try:
            fd = localfs.open_source(task.src, follow=task.follow)
        except TransferError:
            return
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)

    def copy(self, task: FileTask, progress: Progress, cancel: threading.Event) -> None:
        if task.kind == "dir":
            return localfs.make_dir(task)
        if task.kind == "link":
            return localfs.make_link(task, self.options.job_id)
        src = localfs.open_source(task.src, follow=task.follow)
        try:
            if task.size >= _STEP:  # as cp does: the kernel reads further ahead
                os.posix_fadvise(src, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            with localfs.atomic_file(task, self.options.job_id, progress) as dst:
                self._copy_data(src, dst, task.size, progress, cancel)
                if self.options.checksum != "none":
                    verify(self.options.checksum, task.src, dst, follow=task.follow)
        finally:
            os.close(src)

    def copy_range(
        self,
        task: FileTask,
        fd: int,
        offset: int,
        count: int,
        progress: Progress,
        cancel: threading.Event,
    ) -> None:
        src = localfs.open_source(task.src, follow=task.follow)
        try:
            if _copy_range(src, fd, offset, count, progress, cancel) < count:
                raise TransferError(f"{task.src} shrank while staging", permanent=False)
        finally:
            os.close(src)

    def _copy_data(
        self, src: int, dst: int, size: int, progress: Progress, cancel: threading.Event
    ) -> None:
        chunk = self.options.chunk_size
        if size < 2 * chunk or self.options.threads < 2 or _same_device(src, dst):
            # One stream. Parallel chunks pay off reading from a parallel or network file
            # system; within one device they only make the disk seek (docs/performance.md,
            # "POSIX staging"): there, copy like cp does.
            _copy_stream(src, dst, size, progress, cancel)
            return
        os.ftruncate(dst, size)
        ranges = [(off, min(chunk, size - off)) for off in range(0, size, chunk)]
        with ThreadPoolExecutor(self.options.threads, thread_name_prefix="chunk") as pool:
            futures = [
                pool.submit(_copy_range, src, dst, off, n, progress, cancel) for off, n in ranges
            ]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise


def _on_block_device(path: str) -> bool:
    """Is ``path`` (or its nearest existing parent) on a file system with a block device?"""
    while True:
        try:
            return os.major(os.stat(path).st_dev) != 0
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if parent == path:
                return False
            path = parent
        except OSError:
            return False


def _same_device(src: int, dst: int) -> bool:
    return os.fstat(src).st_dev == os.fstat(dst).st_dev


def _copy_stream(
    src: int, dst: int, size: int, progress: Progress, cancel: threading.Event
) -> None:
    """Copy a whole file as ``cp`` does: ``copy_file_range`` on the file positions, asking
    for all that is left (the kernel caps one call near 2 GiB). Few, large calls keep the
    kernel's readahead going (16 MiB calls were much slower: docs/performance.md).
    A cancel is seen between calls; the executor's SIGKILL bounds a long one."""
    done = 0
    while done < size:
        if cancel.is_set():
            raise Cancelled()
        try:
            n = os.copy_file_range(src, dst, size - done)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            _copy_range(src, dst, done, size - done, progress, cancel)
            return
        if n == 0:  # source shrank under us
            return
        done += n
        progress.add(n)


def _copy_range(
    src: int, dst: int, offset: int, count: int, progress: Progress, cancel: threading.Event
) -> int:
    """Copy ``count`` bytes at ``offset`` in the kernel, falling back to pread/pwrite; the
    bytes copied (fewer if the source ends sooner)."""
    start = offset
    end = offset + count
    while offset < end:
        if cancel.is_set():
            raise Cancelled()
        want = min(_STEP, end - offset)
        try:
            n = os.copy_file_range(src, dst, want, offset, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            n = os.pwrite(dst, os.pread(src, want, offset), offset)
        if n == 0:  # source shrank under us
            break
        offset += n
        progress.add(n)
    return offset - start


class PosixBackend(Backend):
    """Local paths (and ``$BB_SCRATCH``): no URL, no config table, no options, nothing from
    the daemon's environment: a posix to posix transfer carries no other backend's settings
    or secrets."""

    name = "posix"
    movers: ClassVar[dict[tuple[str, str], str]] = {
        ("posix", "posix"): "bbstage.movers.implementations.posix:PosixMover",
    }
    preload = ("bbstage.movers.implementations.posix",)
    local = True

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem()
