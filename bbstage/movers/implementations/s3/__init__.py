"""S3 to POSIX (``S3Download``) and POSIX to S3 (``S3Upload``), through s3fs and aiobotocore.

s3fs builds the client (credentials from the user's own ``~/.aws`` files or from what the
administrator mapped to the user, endpoint/region/addressing from ``[s3]``); the data path is
our own asyncio code on that client, because batching and concurrency are where the speed is:

* many objects at once: ``copy_many`` keeps ``files_in_flight`` objects moving in one event loop;
* big uploads: multipart, ``part_size`` parts, at most ``max_concurrency`` parts in flight per
  transfer (which also bounds memory), aborted on any failure or cancel;
* big downloads: one streamed GET (resumed with a ranged GET after a dropped connection), or
  ``download_concurrency`` ranged GETs written with ``pwrite``.

Downloads write a temporary file beside the destination and rename it into place when the
size is right (``localfs.atomic_file``). Errors name the ``s3://`` URL; throttling, 5xx and
dropped connections are transient (retried by the worker), the rest are permanent.
"""

from __future__ import annotations

import asyncio
import base64
import configparser
import email.utils
import hashlib
import os
import posixpath
import pwd
import re
import stat
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from bbstage.movers import checksum, localfs
from bbstage.movers.base import (
    Cancelled,
    FileTask,
    Mover,
    MoverOptions,
    Progress,
    TransferError,
    os_error,
)

T = TypeVar("T")
MiB = 1 << 20
_READ = 1 * MiB  # bytes asked of the socket per read when streaming a download
_PART_RETRIES = 3  # attempts per request/part inside the mover (the worker retries files)
_URL = re.compile(r"s3://([^/]+)(?:/(.*))?\Z", re.DOTALL)
# Object metadata (x-amz-meta-*) every upload carries: the source's st_mtime_ns, so that a
# later run knows whether the object is this very file (size alone is not enough), and with
# checksum= the digest of the bytes sent, which downloads with checksum= verify.
MTIME_KEY = "bbstage-mtime"


def checksum_key(algorithm: str) -> str:
    """The metadata key of a bbstage checksum (``x-amz-meta-bbstage-xxh3``)."""
    return f"bbstage-{algorithm}"


# -- settings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class S3Settings:
    """``[s3]`` of the daemon config (docs/configuration.md). Defaults measured on RGW."""

    endpoint_url: str | None = None
    region: str = "us-east-1"
    addressing_style: str | None = None  # "path" when endpoint_url is set, else botocore's "auto"
    verify: bool | str = True  # TLS verification, or a CA bundle path
    part_size: int = 16 * MiB
    multipart_threshold: int = 32 * MiB
    max_concurrency: int = 8  # upload parts in flight per transfer
    download_concurrency: int = 1  # ranged GETs per big download (1 = one streamed GET)
    files_in_flight: int = 16  # objects moving at once
    max_pool_connections: int = 32
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    retries: int = 3  # botocore attempts per request ("standard" mode)
    payload_signing: bool = False  # SHA-256 of every upload body (costs CPU; TLS covers it)
    checksums: str = "when_required"  # botocore's request/response checksum calculation
    file_mode: int = 0o644  # mode of downloaded files (directories get the x bits too)

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> S3Settings:
        """Check and convert ``[s3]``: TOML types are required where a quoted value would be
        read wrongly (``payload_signing = "false"`` is an error, not true)."""
        from bbstage.config import parse_size

        sizes = {"part_size", "multipart_threshold"}
        ints = {"max_concurrency", "download_concurrency", "files_in_flight"}
        ints |= {"max_pool_connections", "retries"}
        floats = {"connect_timeout", "read_timeout"}
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            if key == "accounts":
                continue
            try:
                if key in sizes:
                    kwargs[key] = parse_size(value)
                elif key in ints:
                    kwargs[key] = _whole(value)
                    if kwargs[key] < 1:
                        raise ValueError("must be at least 1")
                elif key in floats:
                    if isinstance(value, bool):
                        raise ValueError(f"{value!r} is not a number of seconds")
                    kwargs[key] = float(value)
                elif key == "payload_signing":
                    if not isinstance(value, bool):
                        raise ValueError(f"{value!r}: use true or false (unquoted)")
                    kwargs[key] = value
                elif key == "verify":
                    kwargs[key] = _verify(value)
                elif key == "file_mode":
                    kwargs[key] = parse_mode(value)
                elif key == "checksums":
                    if value not in ("when_required", "when_supported"):
                        raise ValueError("use when_required or when_supported")
                    kwargs[key] = value
                elif key == "addressing_style":
                    if value not in ("path", "virtual", "auto"):
                        raise ValueError("use path, virtual or auto")
                    kwargs[key] = value
                elif key in ("endpoint_url", "region"):
                    kwargs[key] = str(value) or None
                else:
                    raise TransferError(
                        f"daemon config [s3]: unknown key {key!r} (see docs/configuration.md)"
                    )
            except (TypeError, ValueError) as exc:
                raise TransferError(f"daemon config [s3] {key}: {exc}") from None
        settings = cls(**kwargs)
        if settings.part_size < 5 * MiB:
            raise TransferError("daemon config [s3] part_size: S3 needs at least 5M")
        return settings


def parse_mode(value: Any) -> int:
    """A file mode: a TOML integer is the mode itself (``0o644``); a string is octal
    (``"644"``, ``"0644"``, ``"0o644"``). Nothing beyond ``0o777`` (no setuid, sticky)."""
    if isinstance(value, int) and not isinstance(value, bool):
        mode = value
    elif isinstance(value, str) and re.fullmatch(r"(0o?)?[0-7]{1,4}", value.strip()):
        mode = int(value.strip().removeprefix("0o") or "0", 8)
    else:
        raise ValueError(f'{value!r} is not a mode: write 0o644 or "644"')
    if not 0 <= mode <= 0o777:
        raise ValueError(
            f"{value!r} is not a mode between 0o000 and 0o777 (a decimal 644 is 0o1204:"
            ' write 0o644 or "644")'
        )
    return mode


def _whole(value: Any) -> int:
    """A whole number: a TOML integer or a string of digits; never a float cut short."""
    if isinstance(value, bool):
        pass
    elif isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        return int(value)
    raise ValueError(f"{value!r} is not a whole number")


_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "0", "1"}


def _verify(value: Any) -> bool | str:
    """TLS verification: a TOML boolean, or a CA bundle path (never the word "false")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip() and value.strip().lower() not in _BOOL_WORDS:
        return value
    raise ValueError(f"{value!r}: use true or false (unquoted), or the path of a CA bundle")


def mapped_credentials(s3: dict[str, Any], user: str) -> dict[str, str] | None:
    """The credentials the administrator mapped to ``user`` in ``[s3.accounts.<user>]``.

    Runs in the daemon (as root), which can read the root-only config and credentials file;
    the result travels to that user's worker in the transfer spec and nowhere else.
    """
    account = (s3.get("accounts") or {}).get(user)
    if not account:
        return None
    if "access_key" in account:
        creds = {"key": str(account["access_key"]), "secret": str(account["secret_key"])}
        if account.get("session_token"):
            creds["token"] = str(account["session_token"])
        return creds
    path = str(account.get("credentials_file", "/etc/bbstage/s3-credentials"))
    profile = str(account.get("profile", user))
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path) as f:
            parser.read_file(f)
        section = parser[profile]
        creds = {"key": section["aws_access_key_id"], "secret": section["aws_secret_access_key"]}
    except (OSError, KeyError, configparser.Error) as exc:
        raise TransferError(
            f"daemon config [s3.accounts.{user}]: cannot read profile {profile!r} from {path}:"
            f" {exc}; ask the administrator"
        ) from None
    if section.get("aws_session_token"):
        creds["token"] = section["aws_session_token"]
    return creds


def spec_extra(s3: dict[str, Any], uid: int, profile: str | None) -> dict[str, Any]:
    """What ``Engine._spec`` passes to an S3 mover: ``[s3]`` without the account table, the
    directive's ``profile=``, and (only without ``profile=``) this user's mapped credentials."""
    public = {k: v for k, v in s3.items() if k != "accounts"}
    extra: dict[str, Any] = {"s3": public, "profile": profile}
    if not profile and s3.get("accounts"):
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            return extra
        try:
            creds = mapped_credentials(s3, user)
        except TransferError as exc:
            extra["credentials_error"] = str(exc)  # the mover reports it as the job's reason
            return extra
        if creds:
            extra["credentials"] = creds
    return extra


# -- URLs and errors --------------------------------------------------------------------------


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/key`` → ``("bucket", "some/key")``."""
    m = _URL.match(url)
    if not m:
        raise TransferError(f"not an S3 URL: {url} (use s3://bucket/key)")
    return m.group(1), m.group(2) or ""


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_DENIED = {"AccessDenied", "403", "AllAccessDisabled", "AccountProblem", "Forbidden"}
_BAD_CREDS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}
_BAD_CREDS |= {"TokenRefreshRequired", "InvalidSecurity", "AuthorizationHeaderMalformed"}
_TRANSIENT = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling"}
_TRANSIENT |= {"ThrottlingException", "RequestLimitExceeded", "OperationAborted", "BadDigest"}
_TRANSIENT |= {"XAmzContentSHA256Mismatch", "IncompleteBody", "RequestTimeoutException"}
_TRANSIENT |= {"PreconditionFailed", "NoSuchUpload", "500", "502", "503", "504"}


class S3Error(TransferError):
    """A TransferError from S3, with the service's error code (for tests and logs)."""

    def __init__(self, message: str, *, permanent: bool, code: str = "") -> None:
        super().__init__(message, permanent=permanent)
        self.code = code


def translate(exc: BaseException, url: str, who: str, endpoint: str | None) -> TransferError:
    """Map botocore/aiohttp/OS errors to a TransferError that names ``url`` and what to do."""
    import aiohttp
    import botocore.exceptions as bx

    if isinstance(exc, TransferError):
        return exc
    where = endpoint or "the default AWS endpoint"
    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        detail = err.get("Message") or code
        if code == "NoSuchBucket":
            bucket = split_url(url)[0] if url.startswith("s3://") else url
            return S3Error(f"no such bucket: s3://{bucket}/", permanent=True, code=code)
        if code in _NOT_FOUND:
            return S3Error(f"no such object: {url}", permanent=True, code=code)
        if code in _BAD_CREDS:
            return S3Error(
                f"bad S3 credentials for {who}: {where} refused them ({code}); fix"
                f" ~/.aws/credentials or name another profile= (while accessing {url})",
                permanent=True,
                code=code,
            )
        if code in _DENIED:
            return S3Error(
                f"access denied: {url} (using {who}; ask the bucket's owner for access)",
                permanent=True,
                code=code,
            )
        if code in _TRANSIENT or status >= 500 or status == 429:
            return S3Error(
                f"S3 error {code or status}: {detail}: {url}", permanent=False, code=code
            )
        if code == "RequestTimeTooSkewed":
            return S3Error(
                f"S3 refused the request: this host's clock is off ({code}): {url}",
                permanent=True,
                code=code,
            )
        return S3Error(f"S3 error {code or status}: {detail}: {url}", permanent=True, code=code)
    if isinstance(exc, bx.ProfileNotFound):
        return TransferError(
            f"no S3 profile {exc.kwargs.get('profile')!r} in ~/.aws/credentials or ~/.aws/config"
            f" of user {_user()}: add it there or fix profile= (for {url})",
            permanent=True,
        )
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return TransferError(
            f"no S3 credentials for user {_user()}: put them in ~/.aws/credentials or name a"
            f" profile= that has them (for {url})",
            permanent=True,
        )
    if isinstance(exc, bx.ConfigParseError | bx.CredentialRetrievalError):
        return TransferError(f"cannot load S3 credentials for {who}: {exc} (for {url})")
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError):
        return TransferError(f"S3 endpoint not reachable: {where} (for {url})", permanent=False)
    if isinstance(
        exc,
        bx.ReadTimeoutError
        | bx.ConnectionClosedError
        | bx.ResponseStreamingError
        | bx.IncompleteReadError
        | bx.HTTPClientError
        | aiohttp.ClientError
        | asyncio.TimeoutError
        | ConnectionError,
    ):
        return TransferError(
            f"connection to S3 endpoint {where} failed ({type(exc).__name__}): {url}",
            permanent=False,
        )
    if isinstance(exc, bx.ParamValidationError | bx.BotoCoreError):
        return TransferError(f"S3 request failed: {exc}: {url}", permanent=True)
    if isinstance(exc, OSError):
        return os_error(exc)
    return TransferError(f"S3 transfer failed: {type(exc).__name__}: {exc}: {url}")


# -- the movers -------------------------------------------------------------------------------


class _S3Mover(Mover):
    """Shared by both directions: the filesystem, the event loop, batching, errors."""

    def __init__(self, options: MoverOptions) -> None:
        super().__init__(options)
        self.settings = S3Settings.from_config(dict(options.extra.get("s3") or {}))
        self.profile: str | None = options.extra.get("profile") or None
        if options.extra.get("credentials_error"):
            raise TransferError(options.extra["credentials_error"])
        self._creds: dict[str, str] | None = options.extra.get("credentials")
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

    # The filesystem and client are built lazily, on the loop, in the worker's identity.
    def _filesystem(self) -> Any:
        if self._fs is None:
            self._fs = _make_filesystem(self)
        return self._fs

    async def _s3(self) -> Any:
        if self._client is None:
            self._client = await self._filesystem().set_session()
            self.endpoint = self._client.meta.endpoint_url
            self._part_slots = asyncio.Semaphore(self.settings.max_concurrency)
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
        return translate(exc, url, self.who, self.endpoint)

    async def _retry(self, what: str, make: Callable[[], Awaitable[T]]) -> T:
        """One request (or part) with a few quick retries of transient errors."""
        delay = 0.1
        for attempt in range(_PART_RETRIES):
            try:
                return await make()
            except Exception as exc:
                err = self._error(exc, what)
                if err.permanent or attempt == _PART_RETRIES - 1:
                    raise err from None
            await asyncio.sleep(delay)
            delay *= 4
        raise AssertionError("unreachable")

    async def _head(self, bucket: str, key: str) -> dict[str, Any]:
        """HEAD an object. A HEAD answer has no body, so a 403 does not say why: ask again with
        a one-byte GET, whose error names the cause (bad signature, unknown key, denied)."""
        s3 = await self._s3()
        url = f"s3://{bucket}/{key}"
        try:
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

    def remove(self, url: str) -> None:
        """Delete ``url`` and everything under it (for tools that clean up what they wrote)."""
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


def _make_filesystem(mover: _S3Mover) -> Any:
    """An s3fs filesystem with the user's credentials and the site's endpoint settings."""
    import botocore.exceptions as bx
    import s3fs
    from aiobotocore.session import AioSession

    settings = mover.settings
    session = AioSession(profile=mover.profile) if mover.profile else AioSession()
    try:
        # Never the host's credentials: no EC2 instance role, no ECS/container role.
        resolver = session.get_component("credential_provider")
        for name in ("iam-role", "container-role"):
            resolver.remove(name)
        scoped = session.get_scoped_config()
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
        "retries": {"max_attempts": settings.retries, "mode": "standard"},
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


def _safe_rel(rel: str, url: str) -> str:
    """A key's path below the prefix, refused if it would escape the destination."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise TransferError(
            f"refusing to stage {url}: its key is not a safe relative path ({rel!r})"
        )
    return rel


class S3Download(_S3Mover):
    """``s3://bucket/key`` (or ``prefix/``, or a glob) to a local path."""

    def plan(self, src: str, dst: str, *, tree: bool, glob: bool) -> list[FileTask]:
        self.url = src
        return self._run(lambda: self._plan(src, dst, tree=tree, glob=glob))

    async def _plan(self, src: str, dst: str, *, tree: bool, glob: bool) -> list[FileTask]:
        await self._s3()
        bucket, key = split_url(src)
        if glob:
            return await self._plan_glob(bucket, key, dst)
        if tree or not key:
            prefix = key.rstrip("/") + "/" if key.strip("/") else ""
            objects = await self._list(bucket, prefix)
            if not objects:
                raise TransferError(
                    f"no such object: nothing under {src} (is the prefix right?)", permanent=True
                )
            return self._tasks(bucket, prefix, objects, dst.rstrip("/") or "/")
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
            rel = _safe_rel(rel, f"s3://{bucket}/{key}")
            target = posixpath.join(dst, rel)
            dirs.update(_parents(rel, dst))
            tasks.append(
                self._file(f"s3://{bucket}/{key}", target, obj["Size"], obj["LastModified"])
            )
        if not tasks:
            raise TransferError(f"no such object: nothing matches s3://{bucket}/{pattern}")
        return [self._dir(d) for d in sorted(dirs)] + tasks

    def _tasks(
        self, bucket: str, prefix: str, objects: list[dict[str, Any]], dst: str
    ) -> list[FileTask]:
        files, dirs = [], {dst}
        for obj in objects:
            key = obj["Key"]
            url = f"s3://{bucket}/{key}"
            rel = key[len(prefix) :]
            if key.endswith("/"):  # a "directory marker" object
                if rel.strip("/"):
                    dirs.add(posixpath.join(dst, _safe_rel(rel.rstrip("/"), url)))
                continue
            rel = _safe_rel(rel, url)
            dirs.update(_parents(rel, dst))
            files.append(
                self._file(url, posixpath.join(dst, rel), obj["Size"], obj["LastModified"])
            )
        return [self._dir(d) for d in sorted(dirs)] + files

    def _file(self, src: str, dst: str, size: int, modified: Any) -> FileTask:
        mtime_ns = int(modified.timestamp() * 1e9) if modified is not None else None
        return FileTask(src, dst, "file", int(size), self.settings.file_mode, mtime_ns)

    def _dir(self, path: str) -> FileTask:
        mode = self.settings.file_mode
        return FileTask("", path, "dir", mode=mode | ((mode & 0o444) >> 2))

    async def _list(self, bucket: str, prefix: str, limit: int = 0) -> list[dict[str, Any]]:
        s3 = await self._s3()
        out: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            if limit:
                kw["MaxKeys"] = limit
            page = await self._retry(
                f"s3://{bucket}/{prefix}", lambda kw=kw: s3.list_objects_v2(**kw)
            )
            out += page.get("Contents", [])
            token = page.get("NextContinuationToken")
            if not token or (limit and len(out) >= limit):
                return out

    def current(self, task: FileTask) -> bool | None:
        return localfs.current(task)

    def _make_dir(self, task: FileTask) -> None:
        localfs.make_dir(task)

    async def _copy_one(self, task: FileTask, progress: Progress) -> None:
        s3 = await self._s3()
        counted = _Counted(progress)
        seen: dict[str, Any] = {}  # what the GETs said about the object (see _note)
        try:
            with localfs.atomic_file(task, self.options.job_id, counted) as fd:
                parts = self.settings.download_concurrency
                if task.size >= self.settings.multipart_threshold and parts > 1:
                    await self._get_ranged(s3, task, fd, counted, seen)
                else:
                    await self._get_range(s3, task, fd, 0, task.size, counted, seen, whole=True)
                if self.checksum:
                    await self._verify(task, fd, seen)
        except BaseException:
            counted.undo()
            raise

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

    async def _get_ranged(
        self, s3: Any, task: FileTask, fd: int, progress: _Counted, seen: dict[str, Any]
    ) -> None:
        step = self.settings.part_size
        os.ftruncate(fd, task.size)
        slots = asyncio.Semaphore(self.settings.download_concurrency)

        async def part(offset: int) -> None:
            async with slots:
                n = min(step, task.size - offset)
                await self._get_range(s3, task, fd, offset, n, progress, seen)

        await _first_failure(
            [asyncio.ensure_future(part(off)) for off in range(0, task.size, step)]
        )

    async def _get_range(
        self,
        s3: Any,
        task: FileTask,
        fd: int,
        offset: int,
        count: int,
        progress: _Counted,
        seen: dict[str, Any],
        *,
        whole: bool = False,
    ) -> None:
        """Write ``count`` bytes of the object at ``offset`` (``whole``: the object is exactly
        ``count`` bytes, fetch it without a Range); resume after dropped connections."""
        url = task.src
        bucket, key = split_url(url)
        end, pos, failures, delay = offset + count, offset, 0, 0.1
        while True:
            kw: dict[str, Any] = {"Bucket": bucket, "Key": key}
            if pos > 0 or not whole:
                if pos >= end:
                    return
                kw["Range"] = f"bytes={pos}-{end - 1}"
            try:
                resp = await s3.get_object(**kw)
                body = resp["Body"]
                try:
                    self._note(task, resp, seen)
                    if whole and pos == 0 and resp["ContentLength"] != count:
                        raise TransferError(
                            f"{url} changed while staging: it has {resp['ContentLength']} bytes,"
                            f" {count} when planned (requeue the job to stage the new one)"
                        )
                    while True:
                        chunk = await body.read(_READ)
                        if not chunk:
                            break
                        _pwrite(fd, chunk, pos)
                        pos += len(chunk)
                        progress.add(len(chunk))
                finally:
                    body.close()
                if pos < end:
                    raise TransferError(f"{url}: short read at byte {pos}", permanent=False)
                return
            except _LocalError as exc:
                raise os_error(exc.error, task.dst) from None
            except Exception as exc:
                err = self._error(exc, url)
            failures += 1
            if err.permanent or failures >= _PART_RETRIES:
                raise err
            whole = False
            await asyncio.sleep(delay)
            delay *= 4


@dataclass
class _Remote:
    """What we know of an object at an upload's destination: from a LIST (size and time
    only, ``meta`` None) or from a HEAD (with its user metadata)."""

    size: int
    modified: Any  # datetime or None
    meta: dict[str, str] | None = None


class S3Upload(_S3Mover):
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
                if not stat.S_ISREG(st.st_mode):
                    continue
                task = FileTask(task.src, task.dst, "file", st.st_size, None, st.st_mtime_ns)
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
        s3 = await self._s3()
        found: dict[str, _Remote | None] = {}
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            try:
                page = await self._retry(
                    f"s3://{bucket}/{prefix}", lambda kw=kw: s3.list_objects_v2(**kw)
                )
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
        if remote.meta is None or remote.size != task.size or task.mtime_ns is None:
            return False  # a LIST's size differs (else it was HEADed): not this file
        if remote.meta.get(MTIME_KEY) != str(task.mtime_ns):
            return False
        if self.checksum:
            stored = remote.meta.get(checksum_key(self.checksum))
            if stored is None:
                return False  # uploaded without checksum=: send it again, with one
            try:
                return stored == checksum.digest_path(self.checksum, task.src)
            except OSError as exc:
                raise os_error(exc, task.src) from None
        return True

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
        try:
            fd = os.open(task.src, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise os_error(exc, task.src) from None
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
        self, s3: Any, bucket: str, key: str, task: FileTask, fd: int, meta: dict[str, str]
    ) -> None:
        """One PutObject; with ``checksum=``, its digest, Content-MD5 and ETag check."""
        data = os.pread(fd, task.size, 0) if task.size else b""
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
    ) -> None:
        """Parts of ``part_size`` with at most ``max_concurrency`` in flight. With
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
        created = await s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata=meta)
        upload_id = created["UploadId"]
        window = _create_window(created, time.monotonic() - asked)
        slots = self._part_slots
        assert slots is not None
        etags: dict[int, str] = {}
        md5s: dict[int, bytes] = {}
        # With a checksum, part i reads only after part i-1 has read (and hashed) its bytes.
        read = [asyncio.Event() for _ in offsets] if hasher is not None else []

        def load(offset: int, n: int) -> tuple[bytes, bytes]:
            data = os.pread(fd, n, offset)
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
            abort = s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            try:
                await asyncio.shield(abort)
            except BaseException:
                pass  # the bucket's lifecycle rule cleans up what we could not abort
            raise
        finally:
            await self._abort_lost_creates(s3, bucket, key, upload_id, window)
        if hasher is not None:
            if not str(done.get("ETag", "")).strip('"'):  # RGW answers Complete with <ETag/>
                done = await self._head(bucket, key)
            whole = hashlib.md5(b"".join(md5s[n] for n in sorted(md5s))).hexdigest()
            await self._check_etag(s3, bucket, key, task, done, f"{whole}-{len(md5s)}")

    async def _abort_lost_creates(
        self, s3: Any, bucket: str, key: str, ours: str, window: tuple[float, float] | None
    ) -> None:
        """A CreateMultipartUpload whose reply was lost is retried (by botocore), leaving
        an upload nobody knows the id of: abort this key's other uploads that the server
        began while our create call was under way (``window``, in the server's clock).
        Best effort (the bucket's lifecycle rule is the backstop)."""
        if window is None:
            return
        try:
            page = await s3.list_multipart_uploads(Bucket=bucket, Prefix=key)
            for upload in page.get("Uploads", []):
                initiated = upload.get("Initiated")
                if (
                    upload.get("Key") == key
                    and upload.get("UploadId") != ours
                    and initiated is not None
                    and window[0] <= initiated.timestamp() <= window[1]
                ):
                    await s3.abort_multipart_upload(
                        Bucket=bucket, Key=key, UploadId=upload["UploadId"]
                    )
        except Exception:
            pass


def _create_window(reply: dict[str, Any], elapsed: float) -> tuple[float, float] | None:
    """When, in the server's clock (its ``Date`` header, whole seconds), a create call that
    took ``elapsed`` seconds with its retries may have begun uploads; None if unknown."""
    date = reply.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    try:
        end = email.utils.parsedate_to_datetime(date).timestamp()
    except (TypeError, ValueError):
        return None
    return end - elapsed - 1, end + 1


class _LocalError(Exception):
    """An OSError writing the local file (not the network's)."""

    def __init__(self, error: OSError) -> None:
        self.error = error


def _pwrite(fd: int, data: bytes, offset: int) -> None:
    try:
        os.pwrite(fd, data, offset)
    except OSError as exc:
        raise _LocalError(exc) from None


def _parents(rel: str, dst: str) -> set[str]:
    """The destination directories a relative path needs (below ``dst``)."""
    out = set()
    head = posixpath.dirname(rel)
    while head:
        out.add(posixpath.join(dst, head))
        head = posixpath.dirname(head)
    return out
