"""What both directions share: the mover base (filesystem, event loop, batching, retries)."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from bbstage.movers import checksum, retrying
from bbstage.movers.base import (
    Cancelled,
    FileTask,
    Mover,
    MoverOptions,
    Progress,
    TransferError,
)
from bbstage.movers.implementations.s3.budget import HELD, ByteBudget
from bbstage.movers.implementations.s3.direct import DirectGet
from bbstage.movers.implementations.s3.errors import S3Error, _user, translate
from bbstage.movers.implementations.s3.fast import FastS3, is_obstore_error, translate_obstore
from bbstage.movers.implementations.s3.head import DirectHead
from bbstage.movers.implementations.s3.listing import DirectList
from bbstage.movers.implementations.s3.settings import S3Options, S3Settings, check_endpoint
from bbstage.movers.implementations.s3.timestamps import parse_timestamp

T = TypeVar("T")
# Object metadata (x-amz-meta-*) every upload carries: the source's st_mtime_ns, so that a
# later run knows whether the object is this very file (size alone is not enough), and with
# checksum= the digest of the bytes sent, which downloads with checksum= verify.
MTIME_KEY = "bbstage-mtime"


def checksum_key(algorithm: str) -> str:
    """The metadata key of a bbstage checksum (``x-amz-meta-bbstage-xxh3``)."""
    return f"bbstage-{algorithm}"


class _S3Mover(Mover):
    """Shared by both directions: the filesystem, the event loop, batching, errors."""

    def __init__(self, options: MoverOptions) -> None:
        super().__init__(options)
        mine = options.side(S3Options) or S3Options()
        self.settings = mine.s3  # read by the daemon (S3Options)
        self.profile: str | None = mine.profile or None
        if mine.credentials_error:
            raise TransferError(mine.credentials_error)
        self._creds: dict[str, str] | None = mine.credentials
        if self.profile:
            self.who = f"profile {self.profile!r}"
        elif self._creds:
            self.who = f"the credentials the administrator mapped to user {_user()}"
        else:
            self.who = "the default profile"
        self.endpoint = self.settings.endpoint_url
        self.url = "s3://"  # the transfer's S3 side, for messages
        checksum.check(options.checksum)
        self.checksum = options.checksum if options.checksum != "none" else None
        self._fs: Any = None
        self._client: Any = None
        self._part_slots: asyncio.Semaphore | None = None
        self._held: ByteBudget | None = None  # whole small objects in memory (s3/budget.py)
        self.fast: FastS3 | None = None  # small whole-object GETs/PUTs (s3/fast.py)
        self.direct: DirectGet | None = None  # big GETs straight into the file (s3/direct.py)
        self.lister: DirectList | None = None  # LIST pages parsed lean (s3/listing.py)
        self.header: DirectHead | None = None  # HEADs without botocore (s3/head.py)

    # The filesystem and client are built lazily, on the loop, in the worker's identity.
    def _filesystem(self) -> Any:
        if self._fs is None:
            self._fs = _make_filesystem(self)
        return self._fs

    async def _s3(self) -> Any:
        if self._client is None:
            client = await self._filesystem().set_session()
            # Before any request: the user's own endpoint_url must be one the site allows.
            check_endpoint(self.settings, client.meta.endpoint_url, self._endpoint_from())
            self._client, self.endpoint = client, client.meta.endpoint_url
            self._part_slots = asyncio.Semaphore(self.settings.max_concurrency)
            self._held = ByteBudget(HELD)
            if FastS3.available(self.settings, self.endpoint or ""):
                creds = self._creds if not self.profile else None
                session = self._filesystem().session
                self.fast = FastS3(self._client, session, creds, self.settings)
                if DirectGet.available(self.endpoint or ""):
                    self.direct, self.lister = DirectGet(self.fast), DirectList(self.fast)
                    self.header = DirectHead(self.fast)
        return self._client

    def _run(self, make: Callable[[], Awaitable[T]], cancel: threading.Event | None = None) -> T:
        """Run a coroutine on s3fs's loop; a set ``cancel`` cancels it promptly (its cleanup,
        such as aborting a multipart upload, still runs)."""
        from fsspec.asyn import sync

        async def guarded() -> T:
            task = asyncio.ensure_future(make())
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.1)
                if done:
                    return task.result()
                if cancel is not None and cancel.is_set():
                    task.cancel()
                    try:
                        await task
                    except BaseException:
                        pass
                    raise Cancelled()

        fs = self._filesystem()
        try:
            return sync(fs.loop, guarded)
        except TransferError:
            raise
        except Exception as exc:
            raise self._error(exc, self.url) from None

    def _error(self, exc: BaseException, url: str) -> TransferError:
        if is_obstore_error(exc):
            where = self.endpoint or "the default AWS endpoint"
            return translate_obstore(exc, url, self.who, where)
        return translate(exc, url, self.who, self.endpoint)

    async def _retry(self, what: str, make: Callable[[], Awaitable[T]]) -> T:
        """One request (or part), tried again after a transient error (``retrying.REQUEST``)."""
        waits = retrying.REQUEST.waits()
        while True:
            try:
                return await make()
            except Exception as exc:
                err = self._error(exc, what)
                delay = next(waits, None)
                if err.permanent or delay is None:
                    raise err from None
            await asyncio.sleep(delay)

    async def _list_page(
        self, bucket: str, prefix: str, token: str | None = None, limit: int = 0
    ) -> dict[str, Any]:
        """One page of the keys under ``prefix`` (``Contents``, ``NextContinuationToken``
        as botocore names them), retried like a part: through ``lister`` where it serves."""
        s3 = await self._s3()  # first: it makes ``lister``
        lister, what = self.lister, f"s3://{bucket}/{prefix}"
        if lister is not None:
            return await self._retry(what, lambda: lister.page(bucket, prefix, token, limit))
        kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if token:
            kw["ContinuationToken"] = token
        if limit:
            kw["MaxKeys"] = limit
        return await self._retry(what, lambda: s3.list_objects_v2(**kw))

    async def _head(self, bucket: str, key: str) -> dict[str, Any]:
        """HEAD an object. A HEAD answer has no body, so a 403 does not say why: ask again with
        a one-byte GET, whose error names the cause (bad signature, unknown key, denied)."""
        s3 = await self._s3()  # first: it makes ``header``
        url, header = f"s3://{bucket}/{key}", self.header
        try:
            if header is not None:
                return await self._retry(url, lambda: header.head(bucket, key))
            return await self._retry(url, lambda: s3.head_object(Bucket=bucket, Key=key))
        except S3Error as exc:
            if exc.code != "403":
                raise
        resp = await self._retry(
            url, lambda: s3.get_object(Bucket=bucket, Key=key, Range="bytes=0-0")
        )
        resp["Body"].close()
        raise S3Error(f"access denied: {url} (using {self.who})", permanent=True, code="403")

    def copy(self, task: FileTask, progress: Progress, cancel: threading.Event) -> None:
        if task.kind == "dir":
            return self._make_dir(task)
        self._run(lambda: self._copy_one(task, progress), cancel)

    def copy_many(
        self,
        tasks: list[FileTask],
        progress: Progress,
        cancel: threading.Event,
        done: Callable[[FileTask], None],
    ) -> dict[FileTask, TransferError]:
        """Copy many entries at once (see ``Mover.copy_many``): ``files_in_flight`` objects
        concurrently on one event loop; stops at the first permanent error."""
        for task in tasks:
            if task.kind == "dir":
                self._make_dir(task)
        todo = [t for t in tasks if t.kind != "dir"]
        return self._run(lambda: self._copy_many(todo, progress, done), cancel) if todo else {}

    async def _copy_many(
        self, tasks: list[FileTask], progress: Progress, done: Callable[[FileTask], None]
    ) -> dict[FileTask, TransferError]:
        await self._s3()
        failures: dict[FileTask, TransferError] = {}
        queue = iter(tasks)

        async def runner() -> None:
            for task in queue:
                try:
                    await self._copy_one(task, progress)
                except Exception as exc:
                    err = self._error(exc, task.src if task.src.startswith("s3:") else task.dst)
                    failures[task] = err
                    if err.permanent:
                        raise err from None
                    continue
                done(task)

        runners = [
            asyncio.ensure_future(runner())
            for _ in range(min(self.settings.files_in_flight, len(tasks)))
        ]
        try:
            await _first_failure(runners)
        except TransferError:
            pass  # recorded in failures
        return failures

    def _make_dir(self, task: FileTask) -> None:
        pass

    async def _copy_one(self, task: FileTask, progress: Progress) -> None:
        raise NotImplementedError

    def _endpoint_from(self) -> str:
        """Where a refused endpoint came from, for its message."""
        profile = f"profile {self.profile}" if self.profile else "default"
        return f"endpoint_url of [{profile}] in ~/.aws/config of user {_user()}"

    def remove(self, url: str) -> None:
        """Delete ``url`` and everything under it (for tools that clean up what they wrote)."""
        self._run(self._s3)  # the endpoint checked
        fs = self._filesystem()
        keys = self._run(lambda: fs._find(url.removeprefix("s3://")))
        if keys:
            self._run(lambda: fs._rm(keys))

    def close(self) -> None:
        if self._client is not None and self._fs is not None:
            try:
                self._run(lambda: self._fs._s3creator.__aexit__(None, None, None))
            except Exception:
                pass
            self._client = None


@functools.cache
def botocore_loader() -> Any:
    """One botocore data loader per process, so that every client it builds reuses the S3
    model and endpoint rules it parsed once (a new loader each time cost 0.08-0.23 s per
    transfer). Only botocore's own data: never models from some home's ``~/.aws/models``."""
    from botocore.loaders import Loader

    return Loader(extra_search_paths=[Loader.BUILTIN_DATA_PATH], include_default_search_paths=False)


def warm() -> None:
    """Parse what an S3 client needs into ``botocore_loader`` now (no request is made): the
    executor's forkserver does this once, so its workers start with it."""
    import botocore.session

    session = botocore.session.Session()
    session.register_component("data_loader", botocore_loader())
    session.create_client(
        "s3", region_name="us-east-1", aws_access_key_id="-", aws_secret_access_key="-"
    )


def _make_filesystem(mover: _S3Mover) -> Any:
    """An s3fs filesystem with the user's credentials and the site's endpoint settings."""
    import botocore.exceptions as bx
    import s3fs
    from aiobotocore.session import AioSession

    settings = mover.settings
    session = AioSession(profile=mover.profile) if mover.profile else AioSession()
    session.register_component("data_loader", botocore_loader())
    session.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=parse_timestamp
    )
    try:
        # Never the host's credentials: no EC2 instance role, no ECS/container role.
        resolver = session.get_component("credential_provider")
        for name in ("iam-role", "container-role"):
            resolver.remove(name)
        scoped = session.get_scoped_config()
        if mover.profile or not mover._creds:  # botocore's chain: the user's own config
            _check_profile_chain(settings, session.full_config, mover.profile or "default")
    except bx.ProfileNotFound as exc:
        raise translate(exc, mover.url, mover.who, settings.endpoint_url) from None
    except bx.BotoCoreError as exc:
        raise TransferError(f"cannot read ~/.aws/config of user {_user()}: {exc}") from None
    # A profile's own endpoint_url/region (in ~/.aws/config) wins over the site default.
    endpoint = None if scoped.get("endpoint_url") else settings.endpoint_url
    region = None if scoped.get("region") else settings.region
    style = settings.addressing_style or ("path" if endpoint else "auto")
    s3_config: dict[str, Any] = {"addressing_style": style}
    if not settings.payload_signing:
        s3_config["payload_signing_enabled"] = False
    config_kwargs: dict[str, Any] = {
        "max_pool_connections": settings.max_pool_connections,
        "connect_timeout": settings.connect_timeout,
        "read_timeout": settings.read_timeout,
        # Tries in all, the first included ("max_attempts" would count retries only: one
        # more); beneath bbstage's own per request (retrying.REQUEST), so 1 by default.
        "retries": {"total_max_attempts": settings.retries, "mode": "standard"},
        "s3": s3_config,
        "request_checksum_calculation": settings.checksums,
        "response_checksum_validation": settings.checksums,
    }
    client_kwargs: dict[str, Any] = {"verify": settings.verify}
    if region:
        client_kwargs["region_name"] = region
    creds = mover._creds if not mover.profile else None
    return s3fs.S3FileSystem(
        session=session,
        key=creds["key"] if creds else None,
        secret=creds["secret"] if creds else None,
        token=creds.get("token") if creds else None,
        endpoint_url=endpoint,
        client_kwargs=client_kwargs,
        config_kwargs=config_kwargs,
        skip_instance_cache=True,
        use_listings_cache=False,
        cache_regions=False,
    )


def _check_profile_chain(settings: S3Settings, config: dict[str, Any], profile: str) -> None:
    """Refuse a user's profile whose credentials would make the transfer node reach an
    endpoint the site has not allowed, or take the host's own role, before any request:
    botocore gives every client a profile makes (STS's, to assume a role) the profile's
    ``endpoint_url`` and its ``services`` section's, and the profiles it takes its
    credentials from (``source_profile``) their own; ``credential_source`` names the host's
    instance or container role (and IMDS at ``ec2_metadata_service_endpoint``)."""
    profiles, services = config.get("profiles", {}), config.get("services", {})
    name: str | None = profile
    seen: set[str] = set()
    while name is not None and name not in seen:
        seen.add(name)
        scoped = profiles.get(name, {})
        where = f"[{'default' if name == 'default' else 'profile ' + name}] in ~/.aws/config"
        source = scoped.get("credential_source")
        if source in ("Ec2InstanceMetadata", "EcsContainer"):
            raise TransferError(
                f"credential_source = {source} in {where} of user {_user()}: the host's own"
                " role is never used for a user's transfer; use your own keys"
            )
        found = [("endpoint_url", scoped.get("endpoint_url"))]
        section = scoped.get("services")
        for service, values in (services.get(section) or {}).items():
            if isinstance(values, dict):
                key = f"{service} endpoint_url of [services {section}]"
                found.append((key, values.get("endpoint_url")))
        for key, url in found:
            if url:
                check_endpoint(settings, url, f"{key} of {where} of user {_user()}")
        name = scoped.get("source_profile")


async def _first_failure(tasks: list[asyncio.Future[Any]]) -> None:
    """Wait for all; on the first exception cancel the rest (and wait for them), then raise."""
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    failed = next((t for t in done if not t.cancelled() and t.exception()), None)
    if failed is not None:
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        raise failed.exception()  # type: ignore[misc]


class _Counted:
    """Progress for one file that can take back what it reported if the file fails."""

    def __init__(self, progress: Progress) -> None:
        self.progress, self.bytes = progress, 0

    def add(self, n: int) -> None:
        self.bytes += n
        self.progress.add(n)

    def temp(self, path: str) -> None:
        self.progress.temp(path)

    def undo(self) -> None:
        if self.bytes:
            self.progress.add(-self.bytes)
            self.bytes = 0
