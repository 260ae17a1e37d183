"""S3 URLs, and botocore/aiohttp errors translated into TransferErrors that say what to do."""

from __future__ import annotations

import asyncio
import os
import pwd
import re

from bbstage.movers.base import TransferError, os_error

_URL = re.compile(r"s3://([^/]+)(?:/(.*))?\Z", re.DOTALL)


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
