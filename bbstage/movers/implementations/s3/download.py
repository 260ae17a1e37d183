"""S3 to POSIX: list or HEAD the source, then streamed or ranged GETs into a temporary file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import re
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from bbstage.movers import checksum, counts, localfs, retrying
from bbstage.movers.base import (
    FileTask,
    Progress,
    TransferError,
    not_a_tree,
    os_error,
    safe_rel,
)
from bbstage.movers.implementations.s3.common import (
    _Counted,
    _first_failure,
    _S3Mover,
    checksum_key,
)
from bbstage.movers.implementations.s3.direct import Reached
from bbstage.movers.implementations.s3.errors import _NOT_FOUND, split_url
from bbstage.movers.implementations.s3.fast import FAST_MAX
from bbstage.movers.implementations.s3.settings import MiB

_READ = 1 * MiB  # bytes asked of the socket per read when streaming a download
# Bytes per write to the local file: on ext4 (Linux 6.18) a write of 512 KiB or more cost
# about 5x the CPU of 256 KiB ones (1 GiB: 1.3 s against 0.25 s; docs/performance.md).
_WRITE = 256 << 10


class S3Download(_S3Mover):
    """``s3://bucket/key`` (or ``prefix/``, or a glob) to a local path."""

    def plan(self, src: str, dst: str, *, tree: bool, glob: bool) -> Iterable[FileTask]:
        """A tree: streamed, a LIST page at a time (neither memory nor the wait before the
        first copy grows with the number of objects); an object or a glob: a list."""
        self.url = src
        bucket, key = split_url(src)
        if (tree or not key) and not glob:
            prefix = key.rstrip("/") + "/" if key.strip("/") else ""
            first = self._run(lambda: self._list_page(bucket, prefix))
            if not first.get("Contents"):
                raise self._run(lambda: self._nothing_under(src, bucket, key))
            return self._stream(bucket, prefix, first, dst.rstrip("/") or "/")
        return self._run(lambda: self._plan(src, dst, glob=glob))

    async def _nothing_under(self, src: str, bucket: str, key: str) -> TransferError:
        """The error for a tree with nothing under its prefix: an object of its name is
        a file given as a tree, and the error says what to fix."""
        name = key.rstrip("/")
        if name:
            try:
                await self._head(bucket, name)
                return not_a_tree(src.rstrip("/"))
            except TransferError:
                pass  # no such object either (or none we may see): the prefix is wrong
        return TransferError(
            f"no such object: nothing under {src} (is the prefix right?)", permanent=True
        )

    async def _plan(self, src: str, dst: str, *, glob: bool) -> list[FileTask]:
        await self._s3()
        bucket, key = split_url(src)
        if glob:
            return await self._plan_glob(bucket, key, dst)
        try:
            head = await self._head(bucket, key)
        except TransferError as exc:
            if getattr(exc, "code", "") in _NOT_FOUND:
                if await self._list(bucket, key.rstrip("/") + "/", limit=1):
                    raise TransferError(
                        f"no such object: {src} is a prefix (end the source and destination"
                        " with / to stage a tree)"
                    ) from None
                await self._check_bucket(bucket)
            raise
        return [self._file(src, dst, head["ContentLength"], head["LastModified"])]

    async def _check_bucket(self, bucket: str) -> None:
        """Turn a 404 on an object into "no such bucket" when that is the cause."""
        s3 = await self._s3()
        await self._retry(f"s3://{bucket}/", lambda: s3.head_bucket(Bucket=bucket))

    async def _plan_glob(self, bucket: str, pattern: str, dst: str) -> list[FileTask]:
        from fsspec.utils import glob_translate

        literal = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
        base = literal.rsplit("/", 1)[0] + "/" if "/" in literal else ""
        regex = re.compile(glob_translate(pattern))
        depth = pattern.count("/")
        deep = "**" in pattern
        objects = await self._list(bucket, literal)
        tasks: list[FileTask] = []
        dirs: set[str] = set()
        for obj in objects:
            key = obj["Key"]
            if regex.match(key):
                rel = key[len(base) :] if deep else posixpath.basename(key)
            else:  # inside a matched "directory": stage its subtree, as for local globs
                head = "/".join(key.split("/")[: depth + 1])
                if deep or key == head or not regex.match(head):
                    continue
                rel = posixpath.basename(head) + key[len(head) :]
            if key.endswith("/"):
                continue
            rel = safe_rel(rel, f"s3://{bucket}/{key}")
            target = posixpath.join(dst, rel)
            dirs.update(_parents(rel, dst))
            tasks.append(
                self._file(f"s3://{bucket}/{key}", target, obj["Size"], obj["LastModified"])
            )
        if not tasks:
            raise TransferError(f"no such object: nothing matches s3://{bucket}/{pattern}")
        return [self._dir(d) for d in sorted(dirs)] + tasks

    def _stream(
        self, bucket: str, prefix: str, page: dict[str, Any], dst: str
    ) -> Iterator[FileTask]:
        """The tasks of the keys under ``prefix`` from ``page`` on, the next page listed
        once this one is read; each directory before anything in it."""
        made = {dst}
        yield self._dir(dst)
        while True:
            for obj in page.get("Contents", []):
                key = obj["Key"]
                url, rel = f"s3://{bucket}/{key}", key[len(prefix) :]
                if key.endswith("/"):  # a "directory marker" object
                    if rel.strip("/"):
                        path = posixpath.join(dst, safe_rel(rel.rstrip("/"), url))
                        yield from self._dirs(made, path)
                    continue
                target = posixpath.join(dst, safe_rel(rel, url))
                yield from self._dirs(made, posixpath.dirname(target))
                yield self._file(url, target, obj["Size"], obj["LastModified"])
            token = page.get("NextContinuationToken")
            if not token:
                return
            page = self._run(lambda token=token: self._list_page(bucket, prefix, token))

    def _dirs(self, made: set[str], path: str) -> Iterator[FileTask]:
        """``path`` and the directories above it not ``made`` yet, outermost first."""
        new = []
        while path not in made and path != posixpath.dirname(path):
            made.add(path)
            new.append(path)
            path = posixpath.dirname(path)
        for each in reversed(new):
            yield self._dir(each)

    def _file(self, src: str, dst: str, size: int, modified: Any) -> FileTask:
        mtime_ns = int(modified.timestamp() * 1e9) if modified is not None else None
        nbytes = counts.size(size, src)  # the server's word (listing Size, Content-Length)
        return FileTask(src, dst, "file", nbytes, self.settings.file_mode, mtime_ns)

    def _dir(self, path: str) -> FileTask:
        mode = self.settings.file_mode
        return FileTask("", path, "dir", mode=mode | ((mode & 0o444) >> 2))

    async def _list(self, bucket: str, prefix: str, limit: int = 0) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = await self._list_page(bucket, prefix, token, limit)
            out += page.get("Contents", [])
            token = page.get("NextContinuationToken")
            if not token or (limit and len(out) >= limit):
                return out

    def current(self, task: FileTask) -> bool | None:
        return localfs.current(task)

    def _make_dir(self, task: FileTask) -> None:
        localfs.make_dir(task)

    async def _copy_one(self, task: FileTask, progress: Progress) -> None:
        counted = _Counted(progress)
        seen: dict[str, Any] = {}  # what the GETs said about the object (see _note)
        try:
            with localfs.atomic_file(task, self.options.job_id, counted) as fd:
                parts = self.settings.download_concurrency
                if self.fast is not None and not self.checksum and task.size <= FAST_MAX:
                    await self._get_fast(task, fd, counted)
                elif task.size >= self.settings.multipart_threshold and parts > 1:
                    os.ftruncate(fd, task.size)
                    localfs.preallocate(fd, task.size)
                    await self._get_ranged(task, fd, 0, task.size, counted, seen)
                else:
                    await self._get_range(task, fd, 0, task.size, counted, seen, whole=True)
                if self.checksum:
                    await self._verify(task, fd, seen)
        except BaseException:
            counted.undo()
            raise

    async def _get_fast(self, task: FileTask, fd: int, progress: _Counted) -> None:
        """The whole object in one GET through obstore (s3/fast.py), retried like a part;
        its bytes held in memory from the GET to the write count against the transfer's
        byte budget (s3/budget.py)."""
        assert self.fast is not None and self._held is not None
        fast = self.fast
        bucket, key = split_url(task.src)
        async with self._held.hold(task.size):
            data = await self._retry(task.src, lambda: fast.get(bucket, key, task.size))
            if len(data) != task.size:
                raise TransferError(
                    f"{task.src} changed while staging: it has {_size(len(data), task.size)}"
                    f" bytes, {task.size} when planned (requeue the job to stage the new one)"
                )
            try:
                _pwrite_all(fd, data, 0)
            except _LocalError as exc:
                raise os_error(exc.error, task.dst) from None
            del data
        progress.add(task.size)

    def _note(self, task: FileTask, resp: dict[str, Any], seen: dict[str, Any]) -> None:
        """Check one GET's answer against the others of this file: the same object (ETag),
        and, with ``checksum=``, one that carries a bbstage checksum to verify against."""
        etag = resp.get("ETag")
        if "etag" in seen and etag != seen["etag"]:
            raise TransferError(
                f"{task.src} changed while staging (its ETag changed between requests)",
                permanent=False,
            )
        if "etag" in seen:
            return
        seen["etag"] = etag
        seen["meta"] = {k.lower(): v for k, v in (resp.get("Metadata") or {}).items()}
        if self.checksum and checksum_key(self.checksum) not in seen["meta"]:
            raise TransferError(
                f"checksum={self.checksum}: {task.src} has no bbstage {self.checksum} checksum"
                f" (object metadata x-amz-meta-{checksum_key(self.checksum)}), so its bytes"
                f" cannot be verified: upload it with bbstage and checksum={self.checksum}, or"
                " drop checksum= from the directive"
            )

    async def _verify(self, task: FileTask, fd: int, seen: dict[str, Any]) -> None:
        """Hash the bytes written (read back from the file: ranged parts arrive out of order)
        and compare with the checksum the upload stored; a mismatch is retried."""
        assert self.checksum is not None
        want = seen["meta"][checksum_key(self.checksum)]
        got = await asyncio.to_thread(checksum.digest_fd, self.checksum, fd)
        if got != want:
            raise TransferError(
                f"checksum mismatch ({self.checksum}): {task.src}: the bytes received hash to"
                f" {got}, its x-amz-meta-{checksum_key(self.checksum)} says {want} (the object"
                " is corrupt or was replaced without bbstage: upload it again)",
                permanent=False,
            )

    def copy_range(
        self,
        task: FileTask,
        fd: int,
        offset: int,
        count: int,
        progress: Progress,
        cancel: threading.Event,
    ) -> None:
        counted = _Counted(progress)
        try:
            self._run(lambda: self._get_ranged(task, fd, offset, count, counted, {}), cancel)
        except BaseException:
            counted.undo()
            raise

    async def _get_ranged(
        self,
        task: FileTask,
        fd: int,
        offset: int,
        count: int,
        progress: _Counted,
        seen: dict[str, Any],
    ) -> None:
        """The ``count`` bytes at ``offset`` as ``download_concurrency`` ranges of equal
        size (each at least ``part_size``), all at once: one long GET per connection, as
        the store reads ahead within a GET (1 GiB from RGW: about 6% faster than one
        streamed GET, where 16 MiB parts were slower; docs/performance.md). A cut range
        resumes where it stopped."""
        ways = self.settings.download_concurrency
        step, end = max(self.settings.part_size, -(-count // ways)), offset + count
        slots = asyncio.Semaphore(ways)

        async def part(start: int) -> None:
            async with slots:
                await self._get_range(task, fd, start, min(step, end - start), progress, seen)

        await _first_failure([asyncio.ensure_future(part(p)) for p in range(offset, end, step)])

    async def _get_range(
        self,
        task: FileTask,
        fd: int,
        offset: int,
        count: int,
        progress: _Counted,
        seen: dict[str, Any],
        *,
        whole: bool = False,
    ) -> None:
        """Write ``count`` bytes of the object at ``offset`` as they stream in (``whole``:
        the object is exactly ``count`` bytes, fetch it without a Range); resume after
        dropped connections with a ranged GET from where it stopped."""
        url = task.src
        end, pos, waits = offset + count, offset, retrying.REQUEST.waits()
        while True:
            if pos >= end and not (whole and pos == 0):
                return
            first = whole and pos == 0

            def check(resp: dict[str, Any], first: bool = first) -> None:
                self._note(task, resp, seen)
                if first and resp["ContentLength"] != count:
                    raise TransferError(
                        f"{url} changed while staging: it has {resp['ContentLength']} bytes,"
                        f" {count} when planned (requeue the job to stage the new one)"
                    )

            try:
                if self.direct is not None and not self.checksum:
                    reached = Reached(pos)
                    bucket, key = split_url(url)
                    try:
                        await self.direct.get(
                            bucket,
                            key,
                            fd,
                            reached,
                            None if first else end,
                            check,
                            progress,
                            _pwrite_all,
                        )
                    finally:
                        pos = reached.pos
                else:
                    async with self._get(task, pos, None if first else end) as (resp, chunks):
                        check(resp)
                        async for chunk in chunks:
                            _pwrite_all(fd, chunk, pos)
                            pos += len(chunk)
                            progress.add(len(chunk))
                if pos < end:
                    raise TransferError(f"{url}: short read at byte {pos}", permanent=False)
                return
            except _LocalError as exc:
                raise os_error(exc.error, task.dst) from None
            except Exception as exc:
                err = self._error(exc, url)
            delay = next(waits, None)  # a cut stream goes on from ``pos``: a request
            if err.permanent or delay is None:
                raise err
            await asyncio.sleep(delay)

    @contextlib.asynccontextmanager
    async def _get(
        self, task: FileTask, start: int, end: int | None
    ) -> AsyncIterator[tuple[dict[str, Any], AsyncIterator[Any]]]:
        """One GET of bytes ``start``..``end - 1`` (``end`` None: the whole object) through
        botocore: what it answered (``ETag``, ``ContentLength``, ``Metadata``) and its
        body's chunks."""
        bucket, key = split_url(task.src)
        s3 = await self._s3()
        kw: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if end is not None:
            kw["Range"] = f"bytes={start}-{end - 1}"
        resp = await s3.get_object(**kw)
        try:
            yield resp, _read(resp["Body"])
        finally:
            resp["Body"].close()


def _size(got: int, planned: int) -> str:
    """An object's size as far as a GET of one byte past ``planned`` saw it."""
    return f"more than {planned}" if got > planned else str(got)


class _LocalError(Exception):
    """An OSError writing the local file (not the network's)."""

    def __init__(self, error: OSError) -> None:
        self.error = error


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    """All of ``data`` (a buffer) at ``offset``, at most ``_WRITE`` bytes per call; a local
    error as ``_LocalError``."""
    view, written = memoryview(data), 0
    try:
        while written < len(view):  # pwrite may write less than asked
            piece = view[written : written + _WRITE]
            written += os.pwrite(fd, piece, offset + written)
    except OSError as exc:
        raise _LocalError(exc) from None


async def _read(body: Any) -> AsyncIterator[bytes]:
    """A botocore streaming body's chunks."""
    while True:
        chunk = await body.read(_READ)
        if not chunk:
            return
        yield chunk


def _parents(rel: str, dst: str) -> set[str]:
    """The destination directories a relative path needs (below ``dst``)."""
    out = set()
    head = posixpath.dirname(rel)
    while head:
        out.add(posixpath.join(dst, head))
        head = posixpath.dirname(head)
    return out
