"""POSIX to S3: PutObject or multipart, each object carrying its source's mtime (and digest)."""

from __future__ import annotations

import asyncio
import base64
import email.utils
import hashlib
import os
import stat
import time
from dataclasses import dataclass
from typing import Any

from bbstage.movers import checksum, localfs
from bbstage.movers.base import FileTask, MoverOptions, Progress, TransferError, os_error
from bbstage.movers.implementations.s3.common import (
    MTIME_KEY,
    _Counted,
    _first_failure,
    _S3Mover,
    checksum_key,
)
from bbstage.movers.implementations.s3.errors import _DENIED, _NOT_FOUND, S3Error, split_url
from bbstage.movers.implementations.s3.fast import FAST_MAX


@dataclass
class _Remote:
    """What we know of an object at an upload's destination: from a LIST (size and time
    only, ``meta`` None) or from a HEAD (with its user metadata)."""

    size: int
    modified: Any  # datetime or None
    meta: dict[str, str] | None = None


class S3ObjectUpload(_S3Mover):
    """A local file, tree or glob to ``s3://bucket/key`` (or ``prefix/``).

    Every object gets the source's mtime as metadata (``MTIME_KEY``): a later run of the same
    transfer skips it only when size and that mtime match (``current``); size alone never
    does. With ``checksum=``, the digest of the bytes sent is stored too, and what landed is
    verified: every request carries ``Content-MD5`` (the server refuses a body that differs,
    ``BadDigest``, retried) and the object's ETag must be the MD5 (multipart: the MD5 of the
    parts' MD5s) of what was sent, so a corrupted or mis-assembled object is found at once,
    without reading it back; it is deleted and the upload retried.
    """

    def __init__(self, options: MoverOptions) -> None:
        super().__init__(options)
        self._objects: dict[str, _Remote | None] = {}  # key -> object, None: absent
        self._listed = False  # _objects holds every object under the destination

    def plan(self, src: str, dst: str, *, tree: bool, glob: bool) -> list[FileTask]:
        split_url(dst)
        self.url = dst
        tasks = []
        for task in localfs.plan_local(src, dst, tree=tree, glob=glob):
            if task.kind == "link":  # follow links to files; S3 has no links
                try:
                    st = os.stat(task.src)
                except OSError as exc:
                    raise os_error(exc, task.src) from None
                if not stat.S_ISREG(st.st_mode):  # a link to a FIFO, socket or device
                    tasks.append(FileTask(task.src, task.dst, "special"))
                    continue
                task = FileTask(
                    task.src, task.dst, "file", st.st_size, None, st.st_mtime_ns, follow=True
                )
            tasks.append(task)
        if tree or glob:
            bucket, key = split_url(dst)
            prefix = key.rstrip("/") + "/" if key.strip("/") else ""
            self._run(lambda: self._survey(bucket, prefix, tasks))
        else:
            self._run(self._s3)  # fail early on credentials
        return tasks

    async def _survey(self, bucket: str, prefix: str, tasks: list[FileTask]) -> None:
        """Learn what is already under the destination: one LIST, then a HEAD (for the
        metadata) only of the objects whose size matches their source, many at once. An
        upload to a fresh prefix costs one LIST; a resumed one a HEAD per file, not a PUT."""
        listing = await self._listing(bucket, prefix)
        if listing is None:
            return  # may write but not list: current() asks per object
        self._objects, self._listed = dict(listing), True
        keys = []
        for task in tasks:
            if task.kind == "file":
                key = split_url(task.dst)[1]
                known = listing.get(key)
                if known is not None and known.size == task.size:
                    keys.append(key)
        slots = asyncio.Semaphore(self.settings.files_in_flight)

        async def head(key: str) -> None:
            async with slots:
                self._objects[key] = await self._head_remote(bucket, key)

        if keys:
            await _first_failure([asyncio.ensure_future(head(k)) for k in keys])

    async def _listing(self, bucket: str, prefix: str) -> dict[str, _Remote | None] | None:
        """The objects under the destination (one LIST, not a HEAD each); None if denied."""
        found: dict[str, _Remote | None] = {}
        token: str | None = None
        while True:
            try:
                page = await self._list_page(bucket, prefix, token)
            except S3Error as exc:
                if exc.code in _DENIED:  # may write but not list: check each object instead
                    return None
                raise
            for obj in page.get("Contents", []):
                found[obj["Key"]] = _Remote(obj["Size"], obj.get("LastModified"))
            token = page.get("NextContinuationToken")
            if not token:
                return found

    async def _head_remote(self, bucket: str, key: str) -> _Remote | None:
        try:
            head = await self._head(bucket, key)
        except S3Error as exc:
            if exc.code in _NOT_FOUND:
                return None
            raise
        meta = {k.lower(): v for k, v in (head.get("Metadata") or {}).items()}
        return _Remote(head["ContentLength"], head.get("LastModified"), meta)

    def _remote(self, task: FileTask) -> _Remote | None:
        """The object at ``task.dst`` (HEAD once, unless the plan's survey knows it)."""
        bucket, key = split_url(task.dst)
        if key not in self._objects and not self._listed:
            self._objects[key] = self._run(lambda: self._head_remote(bucket, key))
        return self._objects.get(key)

    def current(self, task: FileTask) -> bool | None:
        """True only for an object of the source's size whose bbstage mtime metadata is the
        source's mtime (and, with ``checksum=``, whose stored digest is the source's)."""
        if task.kind == "dir":
            return True  # S3 has no directories
        remote = self._remote(task)
        if remote is None:
            return None
        if not self._holds(remote, task):
            return False
        if self.checksum:
            stored = remote.meta.get(checksum_key(self.checksum))
            if stored is None:
                return False  # uploaded without checksum=: send it again, with one
            try:
                return stored == checksum.digest_path(self.checksum, task.src, follow=task.follow)
            except OSError as exc:
                raise os_error(exc, task.src) from None
        return True

    @staticmethod
    def _holds(remote: _Remote, task: FileTask) -> bool:
        """Does the object hold ``task``'s file: the source's size and, in its metadata, the
        source's mtime? (A LIST gives no metadata: then not, whatever its size.)"""
        return (
            remote.meta is not None
            and remote.size == task.size
            and task.mtime_ns is not None
            and remote.meta.get(MTIME_KEY) == str(task.mtime_ns)
        )

    def newer(self, task: FileTask) -> bool:
        """``overwrite=newer`` keeps the object if it was last modified (uploaded) no earlier
        than the source's mtime. Object times have whole seconds (HEAD) or milliseconds (LIST),
        so a source changed within that second of the upload counts as newer: it is sent."""
        remote = self._remote(task)
        if remote is None or remote.modified is None:
            return False
        return int(remote.modified.timestamp() * 1e9) >= (task.mtime_ns or 0)

    async def _copy_one(self, task: FileTask, progress: Progress) -> None:
        s3 = await self._s3()
        bucket, key = split_url(task.dst)
        fd = localfs.open_source(task.src, follow=task.follow)
        counted = _Counted(progress)
        try:
            st = os.fstat(fd)
            size = st.st_size
            if size != task.size:
                raise TransferError(
                    f"{task.src} changed while staging: it has {size} bytes, {task.size} when"
                    " planned (is something still writing it?)"
                )
            # The mtime before the bytes are read: a change while reading makes it older
            # than the file's, so the next run sends the file again.
            meta = {MTIME_KEY: str(st.st_mtime_ns)}
            if size < self.settings.multipart_threshold:
                # Read whole into memory: up to FAST_MAX within the transfer's byte budget
                # (s3/budget.py), above it one of max_concurrency part slots.
                assert self._part_slots is not None and self._held is not None
                slots = self._part_slots if size > FAST_MAX else self._held.hold(size)
                async with slots:
                    await self._put(s3, bucket, key, task, fd, meta)
                counted.add(size)
            else:
                await self._multipart(s3, bucket, key, task, fd, counted, meta)
        except BaseException:
            counted.undo()
            raise
        finally:
            os.close(fd)

    async def _put(
        self,
        s3: Any,
        bucket: str,
        key: str,
        task: FileTask,
        fd: int,
        meta: dict[str, str],
        start: int = 0,
    ) -> None:
        """One PutObject of ``task.size`` bytes of ``fd`` from ``start``; with ``checksum=``,
        its digest, Content-MD5 and ETag check."""
        data = os.pread(fd, task.size, start) if task.size else b""
        if len(data) != task.size:
            raise TransferError(f"{task.src} shrank while staging", permanent=False)
        extra: dict[str, Any] = {}
        md5 = b""
        if self.checksum:
            digest = checksum.new(self.checksum)
            digest.update(data)
            meta[checksum_key(self.checksum)] = digest.hexdigest()
            md5 = hashlib.md5(data).digest()
            extra["ContentMD5"] = base64.b64encode(md5).decode()
        if self.fast is not None and not self.checksum and task.size <= FAST_MAX:
            fast = self.fast
            await self._retry(task.dst, lambda: fast.put(bucket, key, data, meta))
            return
        resp = await s3.put_object(
            Bucket=bucket, Key=key, Body=data, ContentLength=task.size, Metadata=meta, **extra
        )
        if self.checksum:
            await self._check_etag(s3, bucket, key, task, resp, md5.hex())

    async def _check_etag(
        self, s3: Any, bucket: str, key: str, task: FileTask, resp: dict[str, Any], want: str
    ) -> None:
        """The server's ETag of what landed must be the MD5 of what we sent; if not, the
        object is deleted (it carries a checksum its bytes do not have) and the file retried."""
        got = str(resp.get("ETag", "")).strip('"')
        if got == want:
            return
        try:
            await s3.delete_object(Bucket=bucket, Key=key)
        except Exception:
            pass
        raise TransferError(
            f"{task.dst}: what landed is not what was sent (ETag {got}, expected {want});"
            " deleted, sending it again",
            permanent=False,
        )

    async def _multipart(
        self,
        s3: Any,
        bucket: str,
        key: str,
        task: FileTask,
        fd: int,
        progress: _Counted,
        meta: dict[str, str],
        start: int = 0,
    ) -> None:
        """``task.size`` bytes of ``fd`` from ``start``, in parts of ``part_size`` with at
        most ``max_concurrency`` in flight. With
        ``checksum=`` the digest goes into the metadata at create time, so the file is hashed
        first; the parts are then read in order and hashed again, and the upload completes
        only if both digests agree (the bytes sent are the bytes the metadata describes)."""
        step = max(self.settings.part_size, -(-task.size // 10_000))
        offsets = range(0, task.size, step)
        hasher: Any = None
        if self.checksum:
            digest = await asyncio.to_thread(checksum.digest_fd, self.checksum, fd)
            meta[checksum_key(self.checksum)] = digest
            hasher = checksum.new(self.checksum)
        asked = time.monotonic()
        try:
            created = await s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata=meta)
        except BaseException:
            await self._abort_lost_creates(s3, bucket, key, None, asked, None)
            raise
        upload_id = created["UploadId"]
        window = create_window(created, time.monotonic() - asked)
        slots = self._part_slots
        assert slots is not None
        etags: dict[int, str] = {}
        md5s: dict[int, bytes] = {}
        # With a checksum, part i reads only after part i-1 has read (and hashed) its bytes.
        read = [asyncio.Event() for _ in offsets] if hasher is not None else []

        def load(offset: int, n: int) -> tuple[bytes, bytes]:
            data = os.pread(fd, n, start + offset)
            if hasher is None:
                return data, b""
            hasher.update(data)
            return data, hashlib.md5(data).digest()

        async def part(number: int, offset: int) -> None:
            if read and number > 1:
                await read[number - 2].wait()
            async with slots:
                n = min(step, task.size - offset)
                data, md5 = await asyncio.to_thread(load, offset, n)
                if read:
                    read[number - 1].set()
                if len(data) != n:
                    raise TransferError(f"{task.src} shrank while staging", permanent=False)
                extra: dict[str, Any] = {}
                if md5:
                    md5s[number] = md5
                    extra["ContentMD5"] = base64.b64encode(md5).decode()
                resp = await self._retry(
                    task.dst,
                    lambda: s3.upload_part(
                        Bucket=bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=data,
                        ContentLength=n,
                        **extra,
                    ),
                )
                etags[number] = resp["ETag"]
                progress.add(n)

        try:
            await _first_failure(
                [asyncio.ensure_future(part(i + 1, off)) for i, off in enumerate(offsets)]
            )
            if hasher is not None and hasher.hexdigest() != meta[checksum_key(self.checksum)]:
                raise TransferError(
                    f"{task.src} changed while staging: its {self.checksum} checksum is not"
                    " what it was when the upload began",
                    permanent=False,
                )
            parts = [{"PartNumber": n, "ETag": etags[n]} for n in sorted(etags)]
            done = await s3.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            await asyncio.shield(self._abort_quietly(s3, bucket, key, upload_id))
            raise
        finally:
            await self._abort_lost_creates(s3, bucket, key, upload_id, asked, window)
        if hasher is not None:
            if not str(done.get("ETag", "")).strip('"'):  # RGW answers Complete with <ETag/>
                done = await self._head(bucket, key)
            whole = hashlib.md5(b"".join(md5s[n] for n in sorted(md5s))).hexdigest()
            await self._check_etag(s3, bucket, key, task, done, f"{whole}-{len(md5s)}")

    async def _abort(self, s3: Any, bucket: str, key: str, upload_id: str) -> None:
        """Abort an upload, retried. One already gone counts as aborted: a retried abort
        whose first reply was lost finds it so."""
        try:
            await self._retry(
                f"s3://{bucket}/{key}",
                lambda: s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id),
            )
        except S3Error as exc:
            if exc.code != "NoSuchUpload":
                raise

    async def _abort_quietly(self, s3: Any, bucket: str, key: str, upload_id: str) -> None:
        """``_abort``, best effort: the bucket's lifecycle rule cleans up what we could not."""
        try:
            await self._abort(s3, bucket, key, upload_id)
        except BaseException:
            pass

    async def _abort_lost_creates(
        self,
        s3: Any,
        bucket: str,
        key: str,
        ours: str | None,
        asked: float,
        window: tuple[float, float] | None,
    ) -> None:
        """A CreateMultipartUpload whose reply was lost is retried (by botocore), leaving
        an upload nobody knows the id of: abort this key's other uploads that the server
        began while our create call was under way (``window``, in the server's clock). A
        create that failed (``ours`` None) has no reply to date it: then the window runs
        from ``asked`` (monotonic) to the listing, dated by the listing's reply. Each abort
        is tried on its own; best effort (the bucket's lifecycle rule is the backstop)."""
        try:
            page = await self._retry(
                f"s3://{bucket}/{key}",
                lambda: s3.list_multipart_uploads(Bucket=bucket, Prefix=key),
            )
        except Exception:
            return
        window = window or create_window(page, time.monotonic() - asked)
        if window is None:
            return
        for upload in page.get("Uploads", []):
            initiated = upload.get("Initiated")
            if (
                upload.get("Key") == key
                and upload.get("UploadId") != ours
                and initiated is not None
                and window[0] <= initiated.timestamp() <= window[1]
            ):
                try:
                    await self._abort(s3, bucket, key, upload["UploadId"])
                except Exception:
                    pass


def create_window(reply: dict[str, Any], elapsed: float) -> tuple[float, float] | None:
    """When, in the server's clock (its ``Date`` header, whole seconds), a create call that
    took ``elapsed`` seconds with its retries may have begun uploads; None if unknown."""
    date = reply.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        end = email.utils.parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        return None
    return end - elapsed - 1, end + 1
