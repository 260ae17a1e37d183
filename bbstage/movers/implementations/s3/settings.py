"""``[s3]`` settings and credentials: what the daemon reads (config check, ``Engine._spec``).

No S3 client here: the daemon checks ``[s3]`` when it loads its config and maps an account's
credentials into a transfer's spec; the movers (``common``) build their client from the result.
"""

from __future__ import annotations

import configparser
import pwd
import re
from dataclasses import dataclass, field
from typing import Any

import structlog

from bbstage.movers import retrying
from bbstage.movers.base import BackendOptions, TransferError
from bbstage.movers.implementations.endpoints import allows, endpoint_list, endpoint_of
from bbstage.units import parse_size

log = structlog.get_logger("bbstage.s3")

MiB = 1 << 20


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
    download_concurrency: int = 4  # ranged GETs at once per big download (1 = one streamed GET)
    files_in_flight: int = 128  # objects moving at once (their bytes within budget.HELD)
    max_pool_connections: int = 128
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    # botocore's (and obstore's) tries per request, beneath bbstage's own (retrying.REQUEST)
    retries: int = retrying.LIBRARY_TRIES
    payload_signing: bool = False  # SHA-256 of every upload body (costs CPU; TLS covers it)
    checksums: str = "when_required"  # botocore's request/response checksum calculation
    file_mode: int = 0o644  # mode of downloaded files (directories get the x bits too)
    # Endpoints a user's own endpoint_url (~/.aws/config) may name, besides endpoint_url
    allowed_endpoints: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> S3Settings:
        """Check and convert ``[s3]``: TOML types are required where a quoted value would be
        read wrongly (``payload_signing = "false"`` is an error, not true)."""
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
                elif key == "allowed_endpoints":
                    kwargs[key] = endpoint_list(value)
                elif key == "endpoint_url":
                    if value:
                        endpoint_of(value)
                    kwargs[key] = str(value) or None
                elif key == "region":
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


def check_endpoint(settings: S3Settings, endpoint: str, whose: str) -> None:
    """Refuse an S3 endpoint the site has not allowed: ``endpoint`` is the one the user's
    client would use (their own ``endpoint_url`` in ``~/.aws/config`` wins over ``[s3]``).
    Allowed: ``[s3] endpoint_url``; each of ``[s3] allowed_endpoints`` (``host:port`` means
    https; an ``http://`` endpoint only when listed as such); and, where ``[s3] endpoint_url``
    is unset, AWS's own https endpoints (``*.amazonaws.com``)."""
    entries = [*settings.allowed_endpoints]
    own: tuple[str, ...] = (".amazonaws.com", ".amazonaws.com.cn")
    if settings.endpoint_url:  # a site's own endpoint: AWS's are not allowed besides it
        entries, own = [*entries, settings.endpoint_url], ()
    if not allows(entries, endpoint, own):
        raise TransferError(
            f"S3 endpoint {endpoint} ({whose}) is not allowed on this site: the"
            " administrator may add it to [s3] allowed_endpoints in the daemon config"
        )


def allow_endpoint(raw: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """``[s3]`` as the config holds it, with ``endpoint`` added to ``allowed_endpoints``: for
    a tool the admin runs as themself (``bbstage bench``) against the store they name (the
    allow-list guards the site against users' endpoints)."""
    return {**raw, "allowed_endpoints": [*raw.get("allowed_endpoints", []), endpoint]}


def user_client(profile: str | None, raw: dict[str, Any]) -> tuple[Any, str | None, str]:
    """What a user's S3 client resolves, for a tool that hands it to another client
    (``bbstage bench``'s peers): the frozen credentials (None without any), never the
    host's instance or container role; the profile's own ``endpoint_url`` and ``region``
    (``~/.aws/config``) over ``[s3]``'s (``raw``), as the movers' client has them."""
    import botocore.session

    settings = S3Settings.from_config(raw)
    session = botocore.session.Session(profile=profile)
    resolver = session.get_component("credential_provider")
    for name in ("iam-role", "container-role"):
        resolver.remove(name)
    creds = session.get_credentials()
    scoped = session.get_scoped_config()
    endpoint = scoped.get("endpoint_url") or settings.endpoint_url
    return (
        creds.get_frozen_credentials() if creds is not None else None,
        endpoint,
        scoped.get("region") or settings.region,
    )


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
    except configparser.Error as exc:
        # Its message quotes the file's raw lines (other users' keys): root's log only.
        log.error("mapped-credentials file malformed", path=path, user=user, error=str(exc))
        raise TransferError(
            "the site's mapped-credentials file is malformed: ask your administrator"
            " (the daemon's log says where)"
        ) from None
    except (OSError, KeyError) as exc:
        raise TransferError(
            f"daemon config [s3.accounts.{user}]: cannot read profile {profile!r} from {path}:"
            f" {exc}; ask the administrator"
        ) from None
    if section.get("aws_session_token"):
        creds["token"] = section["aws_session_token"]
    return creds


@dataclass(frozen=True)
class S3Options(BackendOptions):
    """The S3 side of a transfer, as the worker gets it: ``[s3]`` without the account table,
    the directive's ``profile=``, and (only without ``profile=``) the credentials the
    administrator mapped to the job's user, or why they could not be read."""

    s3: dict[str, Any] = field(default_factory=dict)
    profile: str | None = None
    credentials: dict[str, str] | None = None
    credentials_error: str | None = None


def s3_options(s3: dict[str, Any], uid: int, profile: str | None) -> S3Options:
    """What ``S3Backend.options`` gives a transfer's S3 side (see ``S3Options``)."""
    public = {k: v for k, v in s3.items() if k != "accounts"}
    if profile or not s3.get("accounts"):
        return S3Options(public, profile)
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        return S3Options(public, profile)
    try:
        creds = mapped_credentials(s3, user)
    except TransferError as exc:  # the mover reports it as the job's reason
        return S3Options(public, profile, credentials_error=str(exc))
    return S3Options(public, profile, credentials=creds)
