"""One big file written by several transfer nodes at once, each a byte range (share ``i`` of
``n`` of a single-file transfer: a ``FileRange``), into one temporary file beside
the destination on a shared POSIX file system, and put in place once, by whichever range
ends last.

Every step is idempotent, so Dask's rerun of a range after a node died is harmless:

1. open ``.NAME.bbstage-JOB-GROUP.part`` (``GROUP``: the submission's id, 8 hex digits, so
   an older submission's file is never taken for this one's), create it if needed, never
   truncate it; write the range; ``fsync``.
   A range that has to create it while another range's marker exists fails: the file
   that range wrote into was removed (a sweep), so bytes are missing. The markers are
   looked at before the create: siblings open the new file as soon as it exists and may
   leave their markers before its creator could look again.
2. write this range's marker, ``.NAME.bbstage-JOB-GROUP.rIofN.part``, holding the temporary
   file's identity (``st_dev:st_ino``, taken while it is open, so never a reused inode) and
   the source's size and mtime as this range's node planned them.
3. if every range's marker is there and all name the temporary file as it is now: set its
   mode and mtime and rename it over the destination. A sibling may have done so first:
   then the temporary name is gone and the destination is the same inode (rename keeps
   it), which is success. Markers that differ mean the temporary file was removed and
   made again (a sweep), so its bytes are not all there, or the source changed between
   the ranges' plans: the range fails (transient: the engine retries the transfer as a
   new group).
4. the one that renamed removes the markers.

The names are the job's temporary names (``localfs.temp_name``), so a later attempt's
sweep (``planning.remove_stale_temps``) removes what a failed group left, and keeps the
group still being written. They are reported (``temp``) before they are made, so a range
that is killed or fails has them removed: its siblings are stopped too, and the transfer
is tried again as a new group.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from bbstage.movers.base import FileRange, FileTask, TransferError, os_error, span
from bbstage.movers.localfs import temp_name


def temp_path(dst: str, job_id: str, group: str) -> str:
    return temp_name(dst, job_id, group)


def marker_path(dst: str, job_id: str, part: FileRange) -> str:
    return temp_name(dst, job_id, part.group, f".r{part.index}of{part.count}")


def write_range(
    task: FileTask,
    job_id: str,
    part: FileRange,
    copy: Callable[[int, int, int], None],
    temp: Callable[[str], None] = lambda path: None,
) -> bool:
    """Write ``part`` of ``task``'s file with ``copy(fd, offset, count)`` (which must write
    exactly those bytes of the source at that offset of ``fd``); put the file in place if
    this range is the last one to end. True if this call renamed it. ``temp(path)`` is told
    of the temporary file and of this range's marker before either is made (whoever stops
    this range, and so the transfer, removes them)."""
    tmp = temp_path(task.dst, job_id, part.group)
    temp(tmp)
    offset, count = span(part, task.size)
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
    # Markers already there are stale if this range gets to create the file (see 1. above).
    before = any(_read_marker(m) is not None for m in _markers(task.dst, job_id, part))
    try:
        try:
            fd = os.open(tmp, flags | os.O_CREAT | os.O_EXCL, 0o600)
            made = True
        except FileExistsError:
            fd, made = os.open(tmp, flags), False
    except OSError as exc:
        raise os_error(exc, task.dst) from None
    try:
        st = os.fstat(fd)
        if made and before:
            raise _made_again(task)  # a range ended in a file that is gone
        if st.st_size < task.size:
            os.ftruncate(fd, task.size)  # never shorter: siblings may have written past us
        if count:
            copy(fd, offset, count)
        os.fsync(fd)
        identity = f"{st.st_dev}:{st.st_ino} {task.size}:{task.mtime_ns}"
        marker = marker_path(task.dst, job_id, part)
        temp(marker)
        _write_marker(marker, identity)
        return _put_in_place(task, job_id, part, fd, identity)
    except OSError as exc:
        raise os_error(exc, task.dst) from None
    finally:
        os.close(fd)


def _write_marker(path: str, identity: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, identity.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def _markers(dst: str, job_id: str, part: FileRange) -> list[str]:
    return [
        marker_path(dst, job_id, FileRange(i, part.count, part.group)) for i in range(part.count)
    ]


def _made_again(task: FileTask) -> TransferError:
    return TransferError(
        f"{task.dst}: the temporary file of its ranges was removed while they were written;"
        " staging it again",
        permanent=False,
    )


def _put_in_place(task: FileTask, job_id: str, part: FileRange, fd: int, identity: str) -> bool:
    markers = _markers(task.dst, job_id, part)
    seen = [_read_marker(m) for m in markers]
    if any(s is None for s in seen):
        return False  # a range still under way: the last one puts the file in place
    if any(s != identity for s in seen):  # each taken with its file open: no inode reuse
        raise TransferError(
            f"{task.dst}: its ranges were written into different temporary files (one was"
            " removed) or from different versions of the source; staging it again",
            permanent=False,
        )
    if task.mode is not None:
        os.fchmod(fd, task.mode)
    if task.mtime_ns is not None:
        os.utime(fd, ns=(task.mtime_ns, task.mtime_ns))
    try:
        os.rename(temp_path(task.dst, job_id, part.group), task.dst)
    except FileNotFoundError:
        try:
            st = os.stat(task.dst)
        except FileNotFoundError:
            st = None
        if st is None or f"{st.st_dev}:{st.st_ino}" != identity.split()[0]:
            raise TransferError(
                f"{task.dst}: the temporary file of its ranges is gone", permanent=False
            ) from None
        return False  # a sibling renamed it: done
    for m in markers:
        try:
            os.unlink(m)
        except FileNotFoundError:
            pass
    return True


def _read_marker(path: str) -> str | None:
    """A marker's identity; None if it is absent or still being written (no newline yet:
    its writer checks the markers itself once it has written it)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return data[:-1].decode() if data.endswith(b"\n") else None
