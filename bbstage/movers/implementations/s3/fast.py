"""S3 requests through ``obstore`` (Rust): a GET or PUT there costs the client about a third
of botocore's CPU (docs/performance.md), and with 2 CPUs shared by client and store, client
CPU is throughput. Whole small objects' GETs and single PUTs go this way when there is no
``checksum=`` (it needs ``Content-MD5``, the ETag check and the object's metadata, which
stay botocore's); big GETs go straight into the file (``direct``, with these credentials);
listing, HEAD and multipart uploads stay botocore's. Same endpoint, region, addressing,
TLS settings and the very credentials the botocore client resolved (the user's profile or
mapped keys), re-read before every request so that refreshed temporary credentials are used.
Without obstore installed, against AWS itself, or with virtual-hosted addressing, the movers
use botocore for everything.
"""

from __future__ import annotations

import re
from typing import Any

from bbstage.movers.base import TransferError
from bbstage.movers.implementations.s3.errors import S3Error
from bbstage.movers.implementations.s3.settings import MiB, S3Settings

FAST_MAX = 8 * MiB  # larger objects: direct GETs, and multipart uploads through botocore
# obstore's words for the HTTP status ("... non-2xx status code: 416 Range Not Satisfiable",
# "Client error with status 400"); not any three digits, which the endpoint's address has.
_STATUS = re.compile(r"\bstatus(?: code)?:? ([1-5]\d\d)\b")


class FastS3:
    """One obstore ``S3Store`` per bucket, built from a botocore client's settings."""

    def __init__(
        self, client: Any, session: Any, creds: dict[str, str] | None, settings: S3Settings
    ) -> None:
        self._client, self._session, self._static = client, session, creds
        self._settings = settings
        self._stores: dict[str, tuple[tuple[str, str, str | None], Any]] = {}

    @staticmethod
    def available(settings: S3Settings, endpoint: str) -> bool:
        """obstore installed, and a site's own endpoint with path-style addressing (AWS itself
        stays on botocore, which follows its region redirects and virtual-hosted names)."""
        try:
            import obstore  # noqa: F401
        except ImportError:
            return False
        host = endpoint.split("://", 1)[-1].split("/", 1)[0]
        return settings.addressing_style != "virtual" and not host.endswith(".amazonaws.com")

    @property
    def endpoint(self) -> str:
        return str(self._client.meta.endpoint_url)

    @property
    def region(self) -> str:
        return str(self._client.meta.region_name or self._settings.region)

    @property
    def settings(self) -> S3Settings:
        return self._settings

    async def credentials(self) -> tuple[str, str, str | None]:
        """The credentials of every request (re-read: temporary ones are refreshed)."""
        if self._static:
            return self._static["key"], self._static["secret"], self._static.get("token")
        creds = await self._session.get_credentials()
        if creds is None:  # as botocore raises it: errors.translate names the user and the fix
            from botocore.exceptions import NoCredentialsError

            raise NoCredentialsError()
        frozen = await creds.get_frozen_credentials()
        return frozen.access_key, frozen.secret_key, frozen.token

    async def store(self, bucket: str) -> Any:
        from obstore.store import S3Store

        creds = await self.credentials()
        known = self._stores.get(bucket)
        if known is not None and known[0] == creds:
            return known[1]
        settings, meta = self._settings, self._client.meta
        endpoint = meta.endpoint_url
        client_options: dict[str, Any] = {
            "allow_http": endpoint.startswith("http://"),
            "connect_timeout": f"{settings.connect_timeout}s",
            "timeout": f"{settings.read_timeout}s",
            "pool_max_idle_per_host": str(settings.max_pool_connections),
        }
        # Without TLS (http://) nothing is verified, so no roots are loaded: obstore reads
        # every file of /etc/ssl/certs for them (~290, 50 ms with a cold page cache) at each
        # store, that is at each transfer's first small object.
        if settings.verify is False or endpoint.startswith("http://"):
            client_options["allow_invalid_certificates"] = True
        elif isinstance(settings.verify, str):
            with open(settings.verify, "rb") as f:
                client_options["root_certificate"] = f.read()
        config: dict[str, Any] = {
            "endpoint": endpoint,
            "region": meta.region_name or settings.region,
            "access_key_id": creds[0],
            "secret_access_key": creds[1],
            "unsigned_payload": not settings.payload_signing,
            "virtual_hosted_style_request": False,
        }
        if creds[2]:
            config["session_token"] = creds[2]
        store = S3Store(
            bucket,
            config=config,
            client_options=client_options,
            retry_config={"max_retries": max(0, settings.retries - 1)},
        )
        self._stores[bucket] = (creds, store)
        return store

    async def get(self, bucket: str, key: str, size: int) -> Any:
        """The object planned at ``size`` bytes, as obstore's buffer (not copied): bytes
        0..``size`` asked in one call (one wake-up of the event loop where a GET and then
        its body took two), one byte past the planned end so that an object that grew
        since is seen, and never more (an empty object refuses any Range: no bytes)."""
        import obstore

        store = await self.store(bucket)
        try:
            return await obstore.get_range_async(store, key, start=0, end=size + 1)
        except Exception as exc:
            if _status(str(exc)) == 416:
                return b""
            raise ObstoreError(exc) from exc

    async def put(self, bucket: str, key: str, data: bytes, meta: dict[str, str]) -> None:
        import obstore

        store = await self.store(bucket)
        try:
            await obstore.put_async(store, key, data, attributes=dict(meta), use_multipart=False)
        except Exception as exc:
            raise ObstoreError(exc) from exc


class ObstoreError(Exception):
    """What obstore raised (it raises builtins such as FileNotFoundError for a missing object
    or bucket, which must not read as a local file's error)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def is_obstore_error(exc: BaseException) -> bool:
    return isinstance(exc, ObstoreError)


def translate_obstore(exc: BaseException, url: str, who: str, where: str) -> TransferError:
    """An obstore error as the botocore ones read (``errors.translate``)."""
    inner = exc.error if isinstance(exc, ObstoreError) else exc
    name, text = type(inner).__name__, str(inner)
    if "NoSuchBucket" in text:
        bucket = url.removeprefix("s3://").split("/", 1)[0]
        return S3Error(f"no such bucket: s3://{bucket}/", permanent=True, code="NoSuchBucket")
    if name in ("NotFoundError", "FileNotFoundError"):
        return S3Error(f"no such object: {url}", permanent=True, code="NoSuchKey")
    if name == "UnauthenticatedError" or any(
        code in text for code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken")
    ):
        return S3Error(
            f"bad S3 credentials for {who}: {where} refused them; fix ~/.aws/credentials or"
            f" name another profile= (while accessing {url})",
            permanent=True,
            code="InvalidAccessKeyId",
        )
    if name in ("PermissionDeniedError", "PermissionError"):
        return S3Error(
            f"access denied: {url} (using {who}; ask the bucket's owner for access)",
            permanent=True,
            code="403",
        )
    status = _status(text)
    if status and 400 <= status < 500 and status not in (408, 429):
        return S3Error(f"S3 error {status}: {text}: {url}", permanent=True, code=str(status))
    # 5xx, throttling, dropped or cut connections, timeouts: the worker retries the file.
    return S3Error(
        f"S3 request to {where} failed ({name}): {text.splitlines()[0] if text else ''}: {url}",
        permanent=False,
        code=str(status or ""),
    )


def _status(text: str) -> int:
    """The HTTP status an obstore error names, or 0."""
    found = _STATUS.search(text)
    return int(found.group(1)) if found else 0
