"""One table that translates a store's errors into ``TransferError``s (as s3fs's
``errors.py``): which are permanent, what the user reads, the URL named."""

from __future__ import annotations

import ssl

from bbstage.movers.base import TransferError

# One table of error translation: (exception type, what the user reads, permanent).
_ERRORS: tuple[tuple[type[BaseException], str, bool], ...] = (
    (FileNotFoundError, "no such file or directory", True),
    (PermissionError, "permission denied", True),
    (IsADirectoryError, "is a directory", True),
    (NotADirectoryError, "not a directory", True),
    (FileExistsError, "already exists", True),
)


def translate(exc: BaseException, url: str) -> TransferError:
    """A store's exception as a ``TransferError`` naming ``url``: the table's kinds are
    permanent, anything else (connections, timeouts, 5xx) is transient (retried)."""
    if isinstance(exc, TransferError):
        return exc
    cause = exc.__cause__
    aiohttp_cause = type(cause).__module__.split(".")[0] == "aiohttp"
    if isinstance(exc, FileNotFoundError) and aiohttp_cause and getattr(cause, "status", 0) != 404:
        return translate(cause, url)  # fsspec's HTTP says "not found" for any failure
    if isinstance(exc, ssl.SSLCertVerificationError) or hasattr(exc, "certificate_error"):
        return TransferError(
            f"TLS certificate of {url} not trusted ({exc}): the server's CA must be the"
            " system's or the site's [https] ca_bundle",
            permanent=True,
        )
    for kind, words, permanent in _ERRORS:
        if isinstance(exc, kind):
            return TransferError(f"{words}: {url}", permanent=permanent)
    text = str(exc).splitlines()[0] if str(exc) else ""
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    if status in (401, 403):
        return TransferError(f"permission denied: {url} ({text})", permanent=True)
    if status == 404:
        return TransferError(f"no such file or directory: {url}", permanent=True)
    return TransferError(f"{type(exc).__name__}: {text}: {url}", permanent=False)
