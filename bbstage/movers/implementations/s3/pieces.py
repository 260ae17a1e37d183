"""POSIX to S3 with one file split across transfer nodes (a ``FileRange``): each
share uploads its bytes (``movers.base.span``) as an object of its own, a piece
(``.NAME.bbstage-JOB-GROUP.rIofN.part`` beside the destination); the share that finds every
piece there assembles the object from them on the server (``UploadPartCopy``: no byte
crosses a node again) and removes them. No share waits for another (shares queued behind
other work on busy nodes cannot deadlock); two that assemble at once write the same
object. A share that fails removes the pieces: its siblings are stopped, and the transfer
is tried again as a new group, whose shares sweep the old group's pieces.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from bbstage.movers import localfs
from bbstage.movers.base import FileRange, FileTask, Progress, TransferError, span
from bbstage.movers.implementations.s3.common import MTIME_KEY, _Counted, _first_failure
from bbstage.movers.implementations.s3.errors import _NOT_FOUND, S3Error, split_url
from bbstage.movers.implementations.s3.upload import S3ObjectUpload, create_window

MIN_PART = 5 << 20  # S3's smallest part (but the last)
COPY_MAX = 5 << 30  # S3's largest part (and part copy)


class S3Upload(S3ObjectUpload):
    """``S3ObjectUpload``, and a share of one file split across nodes (``copy_share``)."""

    min_share = MIN_PART  # each share of one file is a part at least

    def copy_share(
        self,
        task: FileTask,
        job_id: str,
        shard: FileRange,
        progress: Progress,
        cancel: threading.Event,
    ) -> None:
        """Upload share ``shard`` of ``task``'s bytes (``movers.base.span``) as an object of its
        own, a piece (``.NAME.bbstage-JOB-GROUP.rIofN.part`` beside the destination); the
        share that finds every piece there assembles the object from them on the server
        (``UploadPartCopy``) and removes them. No share waits for another; two that
        assemble at once write the same object. A share that fails removes the pieces (its
        siblings are stopped: the transfer is tried again as a new group)."""
        counted = _Counted(progress)
        try:
            self._run(lambda: self._share(task, job_id, shard, counted), cancel)
        except BaseException:
            counted.undo()
            raise

    async def _share(
        self, task: FileTask, job_id: str, shard: FileRange, progress: _Counted
    ) -> None:
        s3 = await self._s3()
        bucket, key = split_url(task.dst)
        pieces = [_piece_key(key, job_id, FileRange(i, shard.count, shard.group))
                  for i in range(shard.count)]  # fmt: skip
        await self._sweep_pieces(s3, bucket, key, job_id, shard.group)
        offset, count = span(shard, task.size)
        piece = FileTask(task.src, f"s3://{bucket}/{pieces[shard.index]}", "file", count)
        fd = localfs.open_source(task.src, follow=task.follow)
        try:
            st = os.fstat(fd)
            if (st.st_size, st.st_mtime_ns) != (task.size, task.mtime_ns):
                raise TransferError(f"{task.src} changed while staging", permanent=False)
            meta = {MTIME_KEY: str(task.mtime_ns)}
            if count < self.settings.multipart_threshold:
                await self._put(s3, bucket, pieces[shard.index], piece, fd, meta, offset)
                progress.add(count)
            else:
                await self._multipart(s3, bucket, pieces[shard.index], piece, fd, progress, meta,
                                      offset)  # fmt: skip
            await self._assemble(s3, bucket, key, task, pieces)
        except BaseException:
            await asyncio.shield(self._remove(s3, bucket, pieces))
            raise
        finally:
            os.close(fd)

    async def _assemble(
        self, s3: Any, bucket: str, key: str, task: FileTask, pieces: list[str]
    ) -> None:
        """If every piece is there, of this source: the object, made from them by copies on
        the server, then the pieces removed. A piece missing: a share is still uploading."""
        heads = await asyncio.gather(*(self._head_remote(bucket, p) for p in pieces))
        if any(h is None for h in heads):
            return  # the last share to end assembles
        for i, head in enumerate(heads):
            assert head is not None
            want = span(FileRange(i, len(pieces), ""), task.size)[1]
            if head.size != want or (head.meta or {}).get(MTIME_KEY) != str(task.mtime_ns):
                raise TransferError(
                    f"{task.dst}: its pieces are of different versions of {task.src}; staging"
                    " it again",
                    permanent=False,
                )
        asked = time.monotonic()
        meta = {MTIME_KEY: str(task.mtime_ns)}
        created = await s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata=meta)
        upload_id = created["UploadId"]
        window = create_window(created, time.monotonic() - asked)
        copies = [(p, a, b) for p, h in zip(pieces, heads, strict=True) for a, b in _cuts(h.size)]
        slots = self._part_slots
        assert slots is not None

        async def copy(number: int, piece: str, first: int, last: int) -> dict[str, Any]:
            async with slots:
                resp = await self._retry(
                    task.dst,
                    lambda: s3.upload_part_copy(
                        Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                        CopySource={"Bucket": bucket, "Key": piece},
                        CopySourceRange=f"bytes={first}-{last}",
                    ),
                )  # fmt: skip
                return {"PartNumber": number, "ETag": resp["CopyPartResult"]["ETag"]}

        try:
            jobs = [asyncio.ensure_future(copy(n + 1, *c)) for n, c in enumerate(copies)]
            await _first_failure(jobs)
            parts = [j.result() for j in jobs]
            await self._retry(
                task.dst,
                lambda: s3.complete_multipart_upload(
                    Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )
        except BaseException as exc:
            await asyncio.shield(self._abort_quietly(s3, bucket, key, upload_id))
            if isinstance(exc, S3Error) and exc.code in _NOT_FOUND:
                if await self._landed(bucket, key, task):
                    return  # a sibling assembled it and removed the pieces meanwhile
            raise
        finally:
            await self._abort_lost_creates(s3, bucket, key, upload_id, asked, window)
        await self._remove(s3, bucket, pieces)

    async def _landed(self, bucket: str, key: str, task: FileTask) -> bool:
        """Is ``task``'s file at its destination (this size, this source mtime)?"""
        remote = await self._head_remote(bucket, key)
        return remote is not None and self._holds(remote, task)

    async def _sweep_pieces(self, s3: Any, bucket: str, key: str, job_id: str, group: str) -> None:
        """Remove the pieces an earlier group of this job left for this object."""
        prefix = _piece_prefix(key, job_id)
        page = await self._list_page(bucket, prefix)
        stale = [o["Key"] for o in page.get("Contents", []) if f"-{group}." not in o["Key"]]
        await self._remove(s3, bucket, stale)

    async def _remove(self, s3: Any, bucket: str, keys: list[str]) -> None:
        """Delete ``keys`` (best effort: a later group's sweep, or the lifecycle rule)."""
        for k in keys:
            try:
                await self._retry(
                    f"s3://{bucket}/{k}", lambda k=k: s3.delete_object(Bucket=bucket, Key=k)
                )
            except Exception:
                pass


def _piece_prefix(key: str, job_id: str) -> str:
    """The start of the names of this job's pieces of the object ``key`` (any group's)."""
    head, _, tail = key.rpartition("/")
    return f"{head}/" * bool(head) + f".{tail}.bbstage-{job_id}-"


def _piece_key(key: str, job_id: str, shard: FileRange) -> str:
    """Where share ``shard`` of the object ``key`` is uploaded: beside it, named like a
    job's temporary files (``localfs.temp_name``)."""
    return f"{_piece_prefix(key, job_id)}{shard.group}.r{shard.index}of{shard.count}.part"


def _cuts(size: int) -> list[tuple[int, int]]:
    """A piece's byte ranges (first, last) for part copies: equal, at most ``COPY_MAX``."""
    count = -(-size // COPY_MAX)
    step = -(-size // count)
    return [(a, min(size, a + step) - 1) for a in range(0, size, step)]
