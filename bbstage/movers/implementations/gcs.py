"""``gs://``: Google Cloud Storage through gcsfs (``GCSBackend``), with the user's own
application default credentials (``~/.config/gcloud/application_default_credentials.json``,
written by ``gcloud auth application-default login``; none: anonymous, public buckets only).

The credentials file is read here, not by google-auth's default chain: every URL it names
is checked to be Google's over https first (``check_google_credentials``), and a user
without one is anonymous, never the host's own service account.
"""

from __future__ import annotations

import os
from typing import Any

from bbstage.kinds import Text
from bbstage.movers.backends import UrlRule
from bbstage.movers.base import BackendOptions, TransferError
from bbstage.movers.implementations.endpoints import endpoint_of
from bbstage.movers.implementations.fsstore import StoreBackend
from bbstage.settings import Settings


class GCSSettings(Settings, frozen=True):
    """``[gs]`` of the daemon config (docs/configuration.md). ``anonymous``: no credentials
    (public buckets, the emulator); its old string form ``"true"`` is still read."""

    endpoint_url: Text | None = None
    project: Text | None = None
    anonymous: bool = False
    legacy_flags = frozenset({"anonymous"})


class GCSBackend(StoreBackend):
    """``gs://bucket/key``: Google Cloud Storage through gcsfs, with the user's application
    default credentials. ``[gs] endpoint_url`` for a private endpoint (or the emulator, with
    ``anonymous = true`` for tests)."""

    name, schemes, section, protocol = "gs", ("gs",), "gs", "gs"
    settings_type = GCSSettings
    url_rule = UrlRule(
        what="GCS bucket",
        rules="bucket names have 3-63 characters a-z 0-9 . _ - and start and end with a"
        " letter or digit",
        chars=("a-z", "0-9", ".", "_", "-"),
        ends=("a-z", "0-9"),
        low=3,
        high=63,
    )
    preload = ("fsspec", "aiohttp", "gcsfs")
    # 64 MiB x 4, rclone's own multi-thread download: gcp-storage-emulator reads the whole
    # object for each ranged GET, so there a request costs the object's size (8 MiB ranges:
    # 0.3x rclone at 256 MiB; 64 MiB: 1.7x at 256 MiB, 1.4x at 1 GiB); GCS itself does not
    ranges = (64 << 20, 4)
    # a big upload in 50 MiB chunks, as gcsfs's own put_file (its open() sends 5 MiB ones):
    # the emulator rewrites the object at each chunk, 1 GiB took 108 s in 5 MiB chunks
    put_block = 50 << 20

    @classmethod
    def kwargs(cls, settings: Any, url: str) -> dict[str, Any]:
        settings = cls.typed(settings)
        args: dict[str, Any] = {"token": "anon" if settings.anonymous else None}
        if settings.endpoint_url:
            args["endpoint_url"] = str(settings.endpoint_url)
        if settings.project:
            args["project"] = str(settings.project)
        return args

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        """gcsfs's plain JSON-API filesystem (``gcsfs.core``): the package's default class
        (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT) first asks each bucket's layout over gRPC, which
        a private endpoint or the emulator does not answer (a minute of retries per bucket)."""
        from gcsfs.core import GCSFileSystem

        args = cls.kwargs(cls.of(options), url)
        if args["token"] is None:
            args["token"] = user_google_credentials()
        return GCSFileSystem(skip_instance_cache=True, **args)


GOOGLE_ADC = ".config/gcloud/application_default_credentials.json"  # under the user's home


def user_google_credentials() -> Any:
    """The user's own application default credentials (``~/GOOGLE_ADC``), their URLs
    checked (``check_google_credentials``), loaded by google-auth's loader of their type:
    a user's (``gcloud auth application-default login``) or a service account's key; no
    other type (an external account's names a URL or a program to ask, google-auth warns
    against loading them unchecked). No file: anonymous ("anon"), public buckets only.
    Never google-auth's whole default chain, which ends at the host's own service account
    (GCE's metadata server) when the user has no file."""
    from google.oauth2 import credentials as user
    from google.oauth2 import service_account

    path = os.path.join(os.path.expanduser("~"), GOOGLE_ADC)
    info = check_google_credentials(path)
    if info is None:
        return "anon"
    kind = info.get("type") if isinstance(info, dict) else None
    try:
        if kind == "authorized_user":  # (no scopes: the login granted them)
            return user.Credentials.from_authorized_user_info(info)
        if kind == "service_account":
            return service_account.Credentials.from_service_account_info(
                info, scopes=[GOOGLE_SCOPE]
            )
    except ValueError as exc:
        raise TransferError(f"{path}: not usable as Google credentials ({exc})") from None
    raise TransferError(
        f"{path}: credentials of type {kind!r} are not used here: use gcloud auth"
        " application-default login, or a service account's key"
    )


GOOGLE_SCOPE = "https://www.googleapis.com/auth/devstorage.full_control"  # gcsfs's own
# the hosts Google's credentials send a token request to, or name (https only)
GOOGLE_HOSTS = (".googleapis.com", ".google.com")


def check_google_credentials(path: str) -> Any:
    """Refuse application default credentials (``path``, the user's own) that name a URL
    other than Google's over https: google-auth sends a request to the URLs the file names
    (``token_uri`` with the refresh token, ``token_url``, an external account's
    ``credential_source`` ``url``, an impersonation URL), so a user's file could make a
    transfer node reach any host and port it can (a management network, 127.0.0.1).
    Checked before any request is made. The file's JSON; None if there is none."""
    import json

    try:
        with open(path, "rb") as f:
            info = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TransferError(f"{path}: not readable as Google credentials ({exc})") from None
    found: list[tuple[str, Any]] = [("", info)]  # (its key, dotted; a value)
    while found:
        key, value = found.pop()
        if isinstance(value, dict):
            found.extend((f"{key}.{k}".lstrip("."), v) for k, v in value.items())
        elif isinstance(value, list):
            found.extend((key, v) for v in value)
        elif isinstance(value, str) and "://" in value:
            try:
                scheme, host, port = endpoint_of(value.strip())
                named = f"{scheme}://{host}:{port}"
            except ValueError:
                scheme, host, port = "", "", 0
                named = f"{value.partition('://')[0]}://?"
            if not (scheme == "https" and port == 443 and f".{host}".endswith(GOOGLE_HOSTS)):
                raise TransferError(
                    f"{path}: {key} names {named}, not Google's over https:"
                    " the transfer node would send your credentials there (use credentials"
                    " from gcloud auth application-default login)"
                )
    return info
