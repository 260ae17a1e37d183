"""The generic mover: any source to any destination through fsspec, streamed through the
worker (the rules it keeps: ``bbstage.movers.implementations.generic``'s docstring); a
store's errors are translated by ``errors.translate``."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bbstage.movers import checksum, localfs, retrying
from bbstage.movers.base import (
    Cancelled,
    FileTask,
    Mover,
    MoverOptions,
    Progress,
    TransferError,
    not_a_file,
    not_a_tree,
    os_error,
    safe_rel,
)
from bbstage.movers.implementations.generic.errors import translate
from bbstage.movers.implementations.generic.side import Side, mtime_ns

FILE_MODE, DIR_MODE = 0o644, 0o755  # of what a store's files become on a local disk
WHOLE = 4 << 20  # a file up to this size is read whole and written whole (one GET, one PUT)


class GenericMover(Mover):
    """Any source to any destination through fsspec (see the module's docstring)."""

    def __init__(self, options: MoverOptions) -> None:
        super().__init__(options)
        checksum.check(options.checksum)
        self.src = Side(options.source_kind, options.source)
        self.dst = Side(options.destination_kind, options.destination)
        self._made: set[tuple[str, str]] = set()  # directories made on the destination store

    # -- plan -----------------------------------------------------------------------------

    def plan(self, src: str, dst: str, *, tree: bool, glob: bool) -> Iterator[FileTask]:
        if self.src.local:
            return self._plan_local(src, dst, tree=tree, glob=glob)
        return self._plan_store(src, dst, tree=tree, glob=glob)

    def _plan_local(self, src: str, dst: str, *, tree: bool, glob: bool) -> Iterator[FileTask]:
        for task in localfs.plan_local(src, dst, tree=tree, glob=glob):
            if task.kind == "link":  # a store has no links: the file it names
                try:
                    st = os.stat(task.src)
                except OSError as exc:
                    raise os_error(exc, task.src) from None
                if not stat.S_ISREG(st.st_mode):
                    yield FileTask(task.src, task.dst, "special")
                    continue
                task = FileTask(
                    task.src, task.dst, "file", st.st_size, None, st.st_mtime_ns, follow=True
                )
            yield task

    def _plan_store(self, src: str, dst: str, *, tree: bool, glob: bool) -> Iterator[FileTask]:
        """A store's plan: listed now (a failure here is the plan's, retried as one step),
        the sizes a listing lacks asked as the plan is read (``_tree``)."""
        fs, root, backend = self.src.fs(src), self.src.path(src), self.src.backend
        try:
            if glob:
                found = fs.glob(root, detail=True)
                files = [(p, i) for p, i in sorted(found.items()) if i.get("type") != "directory"]
                if not files:
                    raise TransferError(f"no such file or directory: nothing matches {src}")
                return self._matches(src, dst, files)
            if not tree:
                info = backend.info(fs, root)
                if info.get("type") == "directory":
                    raise not_a_file(src)
                return iter([self._task(src, dst, info)])
            found = backend.find(fs, root.rstrip("/"))
        except TransferError:
            raise
        except Exception as exc:
            raise translate(exc, src) from None
        top = root.rstrip("/") + "/"
        if not any(p.startswith(top) and p != top for p in found) and not fs.isdir(top[:-1]):
            if self._call(lambda: fs.isfile(top[:-1]), src):  # find lists a file as itself
                raise not_a_tree(src.rstrip("/"))
            raise TransferError(f"no such file or directory: {src}")
        return self._tree(src, dst, top, sorted(found.items()))

    def _tree(
        self, src: str, dst: str, top: str, listed: list[tuple[str, dict[str, Any]]]
    ) -> Iterator[FileTask]:
        """The tasks of a tree listed as ``listed``, in order; the sizes the listing lacks
        (HTTP's) are all asked at once (``_infos``), each taken as its file comes: the
        first files are copied while the last are still asked. Files this transfer does
        not copy (``options.wanted``: another shard's) are left out, their sizes not asked
        (HTTPS's request of a size brings a small file's bytes)."""
        if self.dst.local:
            yield FileTask(src, dst, "dir", mode=DIR_MODE)
        wanted = self.options.wanted or (lambda target: True)
        backend = self.src.backend
        below: list[tuple[str, str, dict[str, Any], str]] = []  # (path, rel, info, target)
        for path, info in listed:
            if not path.startswith(top) or path == top:
                continue
            rel = path[len(top) :]
            name = safe_rel(backend.name_of(rel).rstrip("/"), backend.unstrip(src, path))
            target = dst.rstrip("/") + "/" + name
            if info.get("type") == "directory" or wanted(target):
                below.append((path, rel, info, target))
        sized = self._sized([(path, info) for path, _, info, _ in below], src)
        for (_, rel, _, target), info in zip(below, sized, strict=True):
            if info.get("type") == "directory":
                if self.dst.local:
                    yield FileTask(src + rel, target, "dir", mode=DIR_MODE)
                continue
            yield self._task(src.rstrip("/") + "/" + rel, target, info)

    def _matches(
        self, src: str, dst: str, files: list[tuple[str, dict[str, Any]]]
    ) -> Iterator[FileTask]:
        """The tasks of the files a wildcard ``src`` matched (``files``: listed), each into
        ``dst`` by its name (``Backend.name_of``: an HTTPS link's decoded), its size as a
        tree's file's (``_sized``)."""
        backend = self.src.backend
        names = [
            safe_rel(backend.name_of(p.rsplit("/", 1)[-1]), backend.unstrip(src, p))
            for p, _ in files
        ]
        for (path, _), name, info in zip(files, names, self._sized(files, src), strict=True):
            yield self._task(backend.unstrip(src, path), dst.rstrip("/") + "/" + name, info)

    def _sized(
        self, listed: list[tuple[str, dict[str, Any]]], src: str
    ) -> Iterator[dict[str, Any]]:
        """The info of each of ``listed`` (path, its listing's info), in order: as listed,
        or, for a file whose listing has no size (HTTP's), asked (``_infos``), never taken
        for 0."""

        def unsized(info: dict[str, Any]) -> bool:
            return info.get("type") != "directory" and info.get("size") is None

        asked = self._infos([path for path, info in listed if unsized(info)], src)
        for _, info in listed:
            yield next(asked) if unsized(info) else info

    def _infos(self, paths: list[str], src: str) -> Iterator[dict[str, Any]]:
        """The info of each of ``paths``, in order, asked ahead (``Backend.infos``). One
        that fails transiently is asked again alone (``retrying.FILE``: a step of the
        plan), and the rest anew after it."""
        fs, backend = self.src.fs(src), self.src.backend
        while paths:
            asked: Iterator[dict[str, Any]] = iter(())
            got = 0
            try:  # an eager backend fails here, a lazy one (HTTPS) as it is read
                asked = iter(backend.infos(fs, paths))
                for info in asked:
                    yield info
                    got += 1
                return
            except Exception as exc:
                error = translate(exc, src)
                if error.permanent:
                    raise error from None
            finally:
                getattr(asked, "close", lambda: None)()
            yield retrying.FILE.run(
                lambda again=paths[got]: self._call(lambda: backend.info(fs, again), src),
                threading.Event(),
            )
            paths = paths[got + 1 :]

    def _task(self, src: str, dst: str, info: dict[str, Any]) -> FileTask:
        size = int(info.get("size") or 0)
        return FileTask(src, dst, "file", size, FILE_MODE, mtime_ns(info))

    # -- current, newer -------------------------------------------------------------------

    def current(self, task: FileTask) -> bool | None:
        if self.dst.local:
            return localfs.current(task)
        info = self.dst.info(task.dst)
        if info is None:
            return None
        if task.kind != "file" or info.get("type") == "directory":
            return False
        mtime = mtime_ns(info)
        return int(info.get("size") or 0) == task.size and (mtime or 0) >= (task.mtime_ns or 0)

    def newer(self, task: FileTask) -> bool:
        if self.dst.local:
            return super().newer(task)
        info = self.dst.info(task.dst)
        return info is not None and (mtime_ns(info) or 0) >= (task.mtime_ns or 0)

    # -- copy -----------------------------------------------------------------------------

    def prefetch(self, task: FileTask) -> None:
        """A small file of a store: its read started now, by the backend's own means
        (``Backend.prefetch``: HTTPS's are many at once on one thread), for ``copy`` to
        take. A hint: nothing is raised."""
        if task.kind != "file" or task.size > WHOLE or self.src.local:
            return
        try:
            self.src.backend.prefetch(self.src.fs(task.src), self.src.path(task.src), task.size)
        except Exception:
            pass  # read again by copy, which fails as it would have

    def close(self) -> None:
        self.src.close()
        self.dst.close()

    def remove_temps(self, parent: str, stale: Callable[[str], bool]) -> int:
        """A killed attempt's temporary files in ``parent`` of a store that takes uploads
        under a temporary name (SFTP), removed, as the user (this worker's identity); a
        directory not there yet has none."""
        if self.dst.local or self.dst.backend.atomic_put:
            return 0
        fs, path = self.dst.fs(parent), self.dst.path(parent)
        try:  # not through _call: it would make a missing directory a permanent failure
            names = fs.ls(path, detail=False)
        except FileNotFoundError:
            return 0
        except Exception as exc:
            raise translate(exc, parent) from None
        found = [name for name in names if stale(os.path.basename(name.rstrip("/")))]
        for name in found:
            self._call(lambda name=name: fs.rm_file(name), parent)
        return len(found)

    def copy(self, task: FileTask, progress: Progress, cancel: threading.Event) -> None:
        if cancel.is_set():
            raise Cancelled()
        if task.kind == "dir":
            if self.dst.local:
                return localfs.make_dir(task)
            if not self.dst.backend.atomic_put:  # a real directory tree (SFTP)
                self._makedirs(task.dst, self.dst.path(task.dst))
            return None
        if task.kind != "file":
            raise TransferError(f"{task.src}: a {task.kind} cannot be copied to {task.dst}")
        digest = checksum.new(self.options.checksum) if self.options.checksum != "none" else None
        if task.size <= WHOLE:
            return self._copy_whole(task, progress, cancel, digest)
        ranges = None if self.src.local else self.src.backend.ranges
        if self.dst.local and ranges is not None and digest is None:
            return self._get_ranges(task, progress, cancel, *ranges)
        with self._reader(task) as source:
            if self.dst.local:
                with localfs.atomic_file(task, self.options.job_id, progress) as fd:
                    self._pump(task, source, lambda b: _write_all(fd, b), progress, cancel, digest)
                    if (
                        digest is not None
                        and checksum.digest_fd(self.options.checksum, fd) != digest.hexdigest()
                    ):
                        raise TransferError(
                            f"checksum mismatch ({self.options.checksum}): {task.src}",
                            permanent=False,
                        )
                return None
            self._put(task, source, progress, cancel, digest)
        return None

    def _copy_whole(
        self, task: FileTask, progress: Progress, cancel: threading.Event, digest: Any
    ) -> None:
        """A small file in one read and one write (a store: one GET, one PUT), not a stream:
        a store's per-request cost is where small files' time goes."""
        if self.src.local:
            fd = localfs.open_source(task.src, follow=task.follow)
            with os.fdopen(fd, "rb") as f:
                data = f.read()
        else:
            fs, path = self.src.fs(task.src), self.src.path(task.src)
            data = self._call(lambda: self.src.backend.read(fs, path, task.size), task.src)
        if len(data) != task.size:
            raise TransferError(
                f"size mismatch: read {len(data)} bytes of {task.src}, planned {task.size}",
                permanent=False,
            )
        if cancel.is_set():
            raise Cancelled()
        if digest is not None:
            digest.update(data)
        if self.dst.local:
            with localfs.atomic_file(task, self.options.job_id, progress) as fd:
                _write_all(fd, data)
                if (
                    digest is not None
                    and checksum.digest_fd(self.options.checksum, fd) != digest.hexdigest()
                ):
                    raise TransferError(
                        f"checksum mismatch ({self.options.checksum}): {task.src}", permanent=False
                    )
            progress.add(len(data))
            return
        fs, final = self.dst.fs(task.dst), self.dst.path(task.dst)
        atomic = self.dst.backend.atomic_put
        target = final if atomic else localfs.temp_name(final, self.options.job_id)
        try:
            if not atomic:
                self._makedirs(task.dst, os.path.dirname(final))
            self._call(lambda: self.dst.backend.write(fs, target, data), task.dst)
            if digest is not None:
                again = checksum.new(self.options.checksum)
                again.update(self._call(lambda: fs.cat_file(target), task.dst))
                if again.hexdigest() != digest.hexdigest():
                    _quietly(lambda: fs.rm_file(target))  # never leave bytes that differ
                    raise TransferError(
                        f"checksum mismatch ({self.options.checksum}): {task.src}", permanent=False
                    )
            if not atomic:
                self._call(lambda: fs.mv(target, final), task.dst)
        except BaseException:
            if not atomic:  # our temporary name; a store's object is replaced whole or not
                _quietly(lambda: fs.rm_file(target))
            raise
        progress.add(len(data))

    def _get_ranges(
        self, task: FileTask, progress: Progress, cancel: threading.Event, size: int, streams: int
    ) -> None:
        """A big file from a store into a local file: ``streams`` ranged reads of ``size``
        bytes at once (the source backend's ``ranges``), each written where it belongs
        (``pwrite``) in the temporary file, given its whole size first (``preallocate``); one
        stream per file is what the stores' clients do badly (a third of rclone's rate)."""
        fs, path = self.src.fs(task.src), self.src.path(task.src)
        starts = list(range(0, task.size, size))
        read_range = self.src.backend.read_range

        with localfs.atomic_file(task, self.options.job_id, progress) as fd:
            localfs.preallocate(fd, task.size)

            def write(offset: int, data: bytes) -> None:
                view = memoryview(data)
                while view:
                    written = os.pwrite(fd, view, offset)
                    view, offset = view[written:], offset + written

            def fetch(start: int) -> int:
                if cancel.is_set():
                    raise Cancelled()
                end = min(start + size, task.size)
                got = self._call(lambda: read_range(fs, path, start, end, write), task.src)
                if got != end - start:
                    raise TransferError(
                        f"short read: {got} of {end - start} bytes at {start} of {task.src}",
                        permanent=False,
                    )
                progress.add(end - start)
                return end - start

            done = 0
            with ThreadPoolExecutor(streams, thread_name_prefix="range") as pool:
                try:
                    for n in pool.map(fetch, starts):
                        done += n
                except BaseException:
                    progress.add(-done)
                    cancel_pending(pool)
                    raise

    def _reader(self, task: FileTask) -> Any:
        if self.src.local:
            return os.fdopen(localfs.open_source(task.src, follow=task.follow), "rb", buffering=0)
        return self._call(
            lambda: self.src.fs(task.src).open(
                self.src.path(task.src), "rb", block_size=self.options.chunk_size
            ),
            task.src,
        )

    def _pump(
        self,
        task: FileTask,
        source: Any,
        write: Any,
        progress: Progress,
        cancel: threading.Event,
        digest: Any,
    ) -> None:
        """Read ``source`` to its end, ``chunk_size`` bytes at a time, into ``write``."""
        step = max(1 << 20, min(self.options.chunk_size, 16 << 20))
        seen = 0
        while True:
            if cancel.is_set():
                raise Cancelled()
            block = self._call(lambda: source.read(step), task.src)
            if not block:
                break
            if digest is not None:
                digest.update(block)
            self._call(lambda b=block: write(b), task.dst)
            seen += len(block)
            progress.add(len(block))
        if seen != task.size:
            progress.add(-seen)
            raise TransferError(
                f"size mismatch: read {seen} bytes of {task.src}, planned {task.size}",
                permanent=False,
            )

    def _put(
        self, task: FileTask, source: Any, progress: Progress, cancel: threading.Event, digest: Any
    ) -> None:
        fs, final = self.dst.fs(task.dst), self.dst.path(task.dst)
        atomic = self.dst.backend.atomic_put
        target = final if atomic else localfs.temp_name(final, self.options.job_id)
        if not atomic:
            self._makedirs(task.dst, os.path.dirname(final))
        block, most = self.dst.backend.put_block, self.dst.backend.put_blocks_max
        if block and most:  # within the store's count of blocks for one object
            block = max(block, -(-task.size // most))
        sized = {"block_size": block} if block else {}
        out = self._call(lambda: fs.open(target, "wb", **sized), task.dst)
        try:
            self._pump(task, source, out.write, progress, cancel, digest)
            self._call(out.close, task.dst)
        except BaseException:
            _discard(out)
            if not atomic:
                _quietly(lambda: fs.rm_file(target))
            raise
        try:
            if digest is not None:
                again = checksum.new(self.options.checksum)
                with self._call(lambda: fs.open(target, "rb"), task.dst) as check:
                    while block := check.read(8 << 20):
                        again.update(block)
                if again.hexdigest() != digest.hexdigest():
                    _quietly(lambda: fs.rm_file(target))
                    raise TransferError(
                        f"checksum mismatch ({self.options.checksum}): {task.src}", permanent=False
                    )
            if not atomic:
                self._call(lambda: fs.mv(target, final), task.dst)
        except BaseException:
            if not atomic:
                _quietly(lambda: fs.rm_file(target))
            raise

    def _makedirs(self, url: str, path: str) -> None:
        """Make the directory ``path`` on ``url``'s store (SFTP) once per transfer: a tree's
        files share a few directories, and each makedirs is a round trip or more."""
        key = (url.split("://", 1)[-1].split("/", 1)[0], path)
        if key in self._made:
            return
        self._call(lambda: self.dst.fs(url).makedirs(path, exist_ok=True), url)
        self._made.add(key)

    def _call(self, fn: Any, url: str) -> Any:
        try:
            return fn()
        except (TransferError, Cancelled):
            raise
        except Exception as exc:
            self._made.clear()  # a directory may be gone: a retry makes them again
            raise translate(exc, url) from None


def _write_all(fd: int, block: bytes) -> None:
    view = memoryview(block)
    while view:
        view = view[os.write(fd, view) :]


def _discard(out: Any) -> None:
    """Drop an unfinished upload. fsspec's ``discard`` leaves the file open, and ``__del__``
    would close it, committing the blocks sent (adlfs: a partial blob): so marked closed."""
    _quietly(getattr(out, "discard", out.close))
    if hasattr(out, "discard"):
        out.closed = True


def _quietly(fn: Any) -> None:
    try:
        fn()
    except Exception:
        pass


def cancel_pending(pool: ThreadPoolExecutor) -> None:
    pool.shutdown(wait=True, cancel_futures=True)
