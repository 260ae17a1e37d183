"""Local-filesystem pieces shared by movers: planning a local source, and atomic writes."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import glob as globmod
import hashlib
import os
import re
import stat
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bbstage.movers.base import (
    FileTask,
    Progress,
    TransferError,
    not_a_file,
    not_a_tree,
    os_error,
)


def plan_local(src: str, dst: str, *, tree: bool, glob: bool) -> Iterator[FileTask]:
    """List a local source: one file, a tree (trailing ``/``) or a glob's matches.

    A missing source, or a tree that is not a directory, is refused here, at once; a tree's
    entries are then yielded as they are found (``_walk``), so a plan of a million files is
    never held in memory."""
    if glob:
        matches = sorted(globmod.glob(src))  # the top-level names only: each a file or a tree
        if not matches:
            raise TransferError(f"no such file or directory: nothing matches {src}")
        return _expand(matches, dst)
    if tree:
        root = src.rstrip("/") or "/"
        return _walk(root, dst.rstrip("/"), _root_mode(root))
    try:
        st = os.stat(src)
    except OSError as exc:
        raise os_error(exc, src) from None
    if stat.S_ISDIR(st.st_mode):
        raise not_a_file(src)
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(src, st.st_mode)
    mode, mtime = stat.S_IMODE(st.st_mode), st.st_mtime_ns
    return iter([FileTask(src, dst, "file", st.st_size, mode, mtime, follow=True)])


def not_regular(path: str, mode: int) -> TransferError:
    """The error for a source that is no regular file: bbstage copies regular files only
    (reading a FIFO or a device could block for ever, or never end)."""
    return TransferError(f"not a regular file: {path} is {_special(mode)}; only regular files"
                         " are staged")  # fmt: skip


def _special(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a file" if not stat.S_ISDIR(mode) else "a directory"


def open_source(path: str, *, follow: bool = False) -> int:
    """Open a source file for reading without ever blocking in ``open``: ``O_NONBLOCK``
    (a FIFO with no writer, a device), then ``fstat`` of what was opened must say regular
    file, then ``O_NONBLOCK`` is cleared. ``follow``: a symbolic link at ``path`` is
    followed (a single-file source named by the user); else refused (``O_NOFOLLOW``: an
    entry of a walked tree, which was no link when it was walked). Every source is opened
    here."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a device without its driver)
            raise TransferError(
                f"not a regular file: {path}; only regular files are staged"
            ) from None
        raise os_error(exc, path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise os_error(exc, path) from None
        raise
    return fd


def _expand(matches: list[str], dst: str) -> Iterator[FileTask]:
    for match in matches:
        target = os.path.join(dst, os.path.basename(match))
        if os.path.isdir(match) and not os.path.islink(match):
            yield from _walk(match, target, _root_mode(match))
        else:
            yield _entry(match, target)


def _entry(path: str, dst: str, st: os.stat_result | None = None) -> FileTask:
    try:
        st = st or os.lstat(path)
    except OSError as exc:
        raise os_error(exc, path) from None
    if stat.S_ISLNK(st.st_mode):
        try:
            return FileTask(path, dst, "link", target=os.readlink(path))
        except OSError as exc:
            raise os_error(exc, path) from None
    if stat.S_ISDIR(st.st_mode):
        return FileTask(path, dst, "dir", mode=stat.S_IMODE(st.st_mode))
    if not stat.S_ISREG(st.st_mode):  # skipped and counted (``planning.Walk``), as rsync does
        return FileTask(path, dst, "special", mode=stat.S_IFMT(st.st_mode))
    return FileTask(path, dst, "file", st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns)


def _root_mode(root: str) -> int:
    """The mode of a tree's root; refuses a root that is not a directory."""
    try:
        st = os.stat(root)
    except OSError as exc:
        raise os_error(exc, root) from None
    if not stat.S_ISDIR(st.st_mode):
        raise not_a_tree(root)
    return stat.S_IMODE(st.st_mode)


def _walk(root: str, dst_root: str, mode: int) -> Iterator[FileTask]:
    """Every directory, file and link under ``root``, as found; links are copied as links,
    never followed. A directory comes before anything in it. Memory is bounded by the
    directories waiting to be read, never by the files: each directory's entries are
    yielded while it is read (``os.walk`` would first list a whole directory)."""
    yield FileTask(root, dst_root, "dir", mode=mode)
    pending = [(root, dst_root)]
    while pending:
        here, there = pending.pop()
        subdirs = []
        try:
            with os.scandir(here) as entries:
                for entry in entries:
                    target = os.path.join(there, entry.name)
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError as exc:
                        raise os_error(exc, entry.path) from None
                    task = _entry(entry.path, target, st)
                    if task.kind == "dir":
                        subdirs.append((entry.path, target))
                    yield task
        except OSError as exc:
            raise os_error(exc, here) from None
        pending += reversed(subdirs)  # depth first, each directory's subdirectories in order


def current(task: FileTask) -> bool | None:
    """Is the local destination already this file? (size and mtime, as rsync's quick check)."""
    try:
        st = os.lstat(task.dst)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_error(exc, task.dst) from None
    if task.kind != "file":
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == task.size and st.st_mtime_ns == task.mtime_ns


def make_dir(task: FileTask) -> None:
    try:
        os.makedirs(task.dst, mode=0o700, exist_ok=True)
        if task.mode is not None:
            os.chmod(task.dst, task.mode)
    except OSError as exc:
        raise os_error(exc, task.dst) from None


def make_link(task: FileTask, job_id: str) -> None:
    tmp = temp_name(task.dst, job_id)
    try:
        os.makedirs(os.path.dirname(task.dst), mode=0o700, exist_ok=True)
        os.symlink(task.target or "", tmp)
        os.rename(tmp, task.dst)
    except OSError as exc:
        raise os_error(exc, task.dst) from None


def temp_name(dst: str, job_id: str, group: str = "", suffix: str = "") -> str:
    """A temporary name beside ``dst``: ``.NAME.bbstage-JOB-GROUP[SUFFIX].part``, ``GROUP``
    8 hex digits (random unless given: ``bbstage.transfer.ranges`` shares one, with ``.rIofN``
    suffixes for its markers). A ``NAME`` too long for that to fit in ``NAME_MAX`` is cut,
    with a hash of it (``_short``): any name that can be staged has a temporary name."""
    head, tail = os.path.split(dst)
    group = group or uuid.uuid4().hex[:8]
    return os.path.join(head, f".{_short(tail)}.bbstage-{job_id}-{group}{suffix}.part")


NAME_MAX = 255  # bytes of one file name (Linux, every common file system)
_HASHED = 17  # "~" and 16 hex digits of the name's hash
# The bytes of NAME that fit beside the rest, for the longest job id (20 digits) and
# suffix (.rIofN, up to 3 digits each): the same for every job, so ``temp_key`` knows it.
_ROOM = NAME_MAX - len("." + ".bbstage-" + "9" * 20 + "-00000000" + ".r999of999" + ".part")


def _short(name: str) -> str:
    """``name``, or if it has more than ``_ROOM`` bytes, its first bytes (whole UTF-8
    characters) and ``~`` and a hash of the whole name: always the same for one name, so a
    file's temporary names are known (``temp_key``) and found again."""
    raw = os.fsencode(name)
    if len(raw) <= _ROOM:
        return name
    cut = raw[: _ROOM - _HASHED].decode("utf-8", "ignore")  # no character split
    return cut + "~" + hashlib.sha256(raw).hexdigest()[:16]


def temp_key(dst: str) -> str:
    """What ``temp_owner`` says of ``dst``'s temporary names: ``dst`` itself unless its
    name had to be cut. The worker keeps a file's temporary files by it."""
    head, tail = os.path.split(dst)
    return os.path.join(head, _short(tail))


def temp_pattern(job_id: str) -> re.Pattern[str]:
    """The names ``temp_name`` gives this job's temporary files, any attempt's."""
    return re.compile(
        rf"\..+\.bbstage-{re.escape(job_id)}-[0-9a-f]{{8}}(\.r[0-9]+of[0-9]+)?\.part\Z", re.DOTALL
    )


_TEMP_NAME = re.compile(r"\.(.+)\.bbstage-.*-[0-9a-f]{8}(?:\.r[0-9]+of[0-9]+)?\.part\Z", re.DOTALL)


def temp_owner(path: str) -> str:
    """The destination a ``temp_name`` stands in for (``path`` itself if it is not one)."""
    head, name = os.path.split(path)
    found = _TEMP_NAME.match(name)
    return os.path.join(head, found.group(1)) if found else path


class atomic_file:  # lower case: used as a function, ``with atomic_file(...) as fd``
    """Yield a write fd on a fresh temporary file in ``task.dst``'s directory; put it in place
    (with the source's mode and mtime) only if the block completes; remove it otherwise.

    A small file, where the file system allows it, is unnamed (``O_TMPFILE``) and linked into
    place at the end: one directory operation per file instead of create + rename, and a
    killed worker leaves nothing behind. Others are a named ``.part`` file (reported through
    ``progress.temp`` so a killed worker's leftovers can be removed) renamed into place, as
    cp and rsync do: on ext4 a big file copied faster that way than into an unnamed one
    (docs/performance.md, "POSIX staging: what makes the difference").
    (A class, not ``@contextmanager``: it runs once per file, and small files are many.)
    """

    __slots__ = ("task", "job_id", "progress", "fd", "tmp")

    def __init__(self, task: FileTask, job_id: str, progress: Progress) -> None:
        self.task, self.job_id, self.progress = task, job_id, progress
        self.fd, self.tmp = -1, None

    def __enter__(self) -> int:
        self.fd, self.tmp = _open_temp(self.task, self.job_id, self.progress)
        return self.fd

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        try:
            if exc is None:
                self._commit()
                return
        except BaseException as failure:
            exc = failure
        finally:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
        if self.tmp is not None:
            with _quiet():
                os.unlink(self.tmp)
        if isinstance(exc, OSError):
            raise os_error(exc, self.task.dst) from None
        raise exc

    def _commit(self) -> None:
        task, fd = self.task, self.fd
        written = os.fstat(fd).st_size
        if written != task.size:
            raise TransferError(
                f"size mismatch: {task.dst} has {written} bytes, {task.src} has {task.size}",
                permanent=False,
            )
        if task.mode is not None:
            os.fchmod(fd, task.mode)
        if task.mtime_ns is not None:
            os.utime(fd, ns=(task.mtime_ns, task.mtime_ns))
        if self.tmp is None:
            self.tmp = _link_into_place(fd, task, self.job_id, self.progress)
        os.close(fd)
        self.fd = -1
        if self.tmp is not None:
            os.rename(self.tmp, task.dst)
            self.tmp = None


def preallocate(fd: int, size: int) -> None:
    """Give ``fd``'s file its ``size`` bytes of disk at once (Linux ``fallocate``: the blocks
    read as zeros until written), where the file system can. A big download then writes
    into allocated blocks instead of ext4's delayed allocation block by block: 1 GiB from
    RGW cost the client about 0.1 s less CPU and was ~4% faster, with client and store on
    the same CPUs (docs/performance.md, sessions 21 and 22). A disk or quota too small fails here,
    before the first byte is fetched. Never emulated by writing zeros (glibc's
    ``posix_fallocate`` does that where the file system lacks it): there, nothing is done."""
    if _fallocate is None:
        return
    while _fallocate(fd, 0, 0, size) != 0:
        err = ctypes.get_errno()
        if err in _NO_FALLOCATE:
            return
        if err != errno.EINTR:
            raise OSError(err, os.strerror(err))


def _libc_fallocate() -> Callable[[int, int, int, int], int] | None:
    try:
        call = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):  # not glibc on Linux
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    call.restype = ctypes.c_int
    return call


_fallocate = _libc_fallocate()
_NO_FALLOCATE = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}  # EINVAL: size 0, odd files


TMPFILE_MAX = 1 << 20  # larger files get a named temporary file (see atomic_file)
_FLAGS = os.O_RDWR | os.O_CLOEXEC
_NO_TMPFILE = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL}  # EISDIR: kernel without it
_tmpfile = hasattr(os, "O_TMPFILE")
_proc_fd: int | None = None  # fd of /proc/self/fd for linkat (reset in a forked child)
_proc_lock = threading.Lock()


def _open_temp(task: FileTask, job_id: str, progress: Progress) -> tuple[int, str | None]:
    """An unnamed file (fd, None), or a named temporary one (fd, path); creates the parent."""
    global _tmpfile
    parent = os.path.dirname(task.dst)
    for attempt in range(2):
        try:
            if _tmpfile and task.size < TMPFILE_MAX and _proc_dir() is not None:
                try:
                    return os.open(parent, _FLAGS | os.O_TMPFILE, 0o600), None
                except OSError as exc:
                    if exc.errno not in _NO_TMPFILE:
                        raise
                    _tmpfile = False  # this file system (or kernel) cannot: named files from now
            tmp = temp_name(task.dst, job_id)
            progress.temp(tmp)
            return os.open(tmp, _FLAGS | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), tmp
        except FileNotFoundError:
            if attempt:
                raise os_error(FileNotFoundError(errno.ENOENT, "", parent), parent) from None
            try:
                os.makedirs(parent, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise os_error(exc, parent) from None
        except OSError as exc:
            raise os_error(exc, task.dst) from None
    raise AssertionError("unreachable")  # pragma: no cover


def _proc_dir() -> int | None:
    """An fd on this process's /proc/self/fd, or None without /proc. (A forked child drops
    its parent's, ``_forget_proc_dir``: no ``getpid`` per file.)"""
    global _proc_fd, _tmpfile
    cached = _proc_fd
    if cached is not None:
        return cached
    with _proc_lock:
        if _proc_fd is None:
            try:
                _proc_fd = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                _tmpfile = False
                return None
        return _proc_fd


def _forget_proc_dir() -> None:
    """In a forked child: the parent's /proc/self/fd handle names the parent's fds."""
    global _proc_fd, _proc_lock
    _proc_lock = threading.Lock()  # another thread may have held it at the fork
    if _proc_fd is not None:
        with _quiet():
            os.close(_proc_fd)
        _proc_fd = None


os.register_at_fork(after_in_child=_forget_proc_dir)


def _link_into_place(fd: int, task: FileTask, job_id: str, progress: Progress) -> str | None:
    """Give the unnamed file ``task.dst`` as its name; if that exists, link it under a
    temporary name and return that (the caller renames it over the old file)."""
    proc = _proc_dir()
    assert proc is not None
    try:
        os.link(str(fd), task.dst, src_dir_fd=proc, follow_symlinks=True)
        return None
    except FileExistsError:
        tmp = temp_name(task.dst, job_id)
        progress.temp(tmp)
        os.link(str(fd), tmp, src_dir_fd=proc, follow_symlinks=True)
        return tmp


@contextmanager
def _quiet() -> Iterator[None]:
    try:
        yield
    except OSError:
        pass
