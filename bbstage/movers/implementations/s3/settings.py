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

import msgspec
import structlog

from bbstage.kinds import (
    ConfigError,
    Count,
    FilePath,
    Kind,
    Seconds,
    Size,
    Text,
    choice,
    expected,
    shown,
)
from bbstage.movers import retrying
from bbstage.movers.base import BackendOptions, TransferError
from bbstage.movers.implementations.endpoints import Endpoint, Endpoints, allows
from bbstage.settings import Settings, convert

log = structlog.get_logger("bbstage.s3")

MiB = 1 << 20


class Mode(int, Kind):
    """A file mode (``parse_mode``)."""

    what = 'a mode from 0o000 to 0o777 (write 0o644 or "644"; a decimal 644 is 0o1204)'

    @classmethod
    def check(cls, value: Any) -> int:
        try:
            return parse_mode(value)
        except ValueError:
            raise expected(cls.what, value) from None


class S3Account(Settings, frozen=True):
    """``[s3.accounts.<user>]``: the credentials the administrator maps to a user: keys
    (``access_key``, ``secret_key``, ``session_token``), or a profile of a credentials file."""

    access_key: Text | None = None
    secret_key: Text | None = None
    session_token: Text | None = None
    credentials_file: FilePath | None = None
    profile: Text | None = None

    def __post_init__(self) -> None:
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("access_key and secret_key: give both, or neither")


_COUNTS = ("max_concurrency", "download_concurrency", "files_in_flight", "max_pool_connections",
           "retries")  # fmt: skip


class S3Settings(Settings, frozen=True):
    """``[s3]`` of the daemon config (docs/configuration.md). Defaults measured on RGW."""

    endpoint_url: Endpoint | None = None
    region: Text | None = "us-east-1"
    # "path" when endpoint_url is set, else botocore's "auto"
    addressing_style: choice("path", "virtual", "auto") | None = None  # type: ignore[valid-type]
    verify: bool | str = True  # TLS verification, or a CA bundle path
    part_size: Size = 16 * MiB
    multipart_threshold: Size = 32 * MiB
    max_concurrency: Count = 8  # upload parts in flight per transfer
    download_concurrency: Count = 4  # ranged GETs at once per big download (1 = one streamed GET)
    files_in_flight: Count = 128  # objects moving at once (their bytes within budget.HELD)
    max_pool_connections: Count = 128
    connect_timeout: Seconds = 10.0
    read_timeout: Seconds = 60.0
    # botocore's (and obstore's) tries per request, beneath bbstage's own (retrying.REQUEST)
    retries: Count = retrying.LIBRARY_TRIES
    payload_signing: bool = False  # SHA-256 of every upload body (costs CPU; TLS covers it)
    # botocore's request/response checksum calculation
    checksums: choice("when_required", "when_supported") = "when_required"  # type: ignore[valid-type]
    file_mode: Mode = 0o644  # mode of downloaded files (directories get the x bits too)
    # Endpoints a user's own endpoint_url (~/.aws/config) may name, besides endpoint_url
    allowed_endpoints: Endpoints = ()
    # [s3.accounts.<user>]: read by the daemon alone; a transfer's options carry none
    accounts: dict[str, S3Account] = {}

    def __post_init__(self) -> None:
        if self.endpoint_url == "":
            msgspec.structs.force_setattr(self, "endpoint_url", None)
        if self.region == "":
            msgspec.structs.force_setattr(self, "region", None)
        if isinstance(self.verify, str) and (
            not self.verify.strip() or self.verify.strip().lower() in _BOOL_WORDS
        ):
            raise ValueError(
                f"verify: expected true or false (unquoted), or the path of a CA bundle,"
                f" got {shown(self.verify)}"
            )
        for key in _COUNTS:
            if getattr(self, key) < 1:
                raise ValueError(
                    f"{key}: expected a whole number, 1 or more, got {getattr(self, key)}"
                )
        if self.part_size < 5 * MiB:
            raise ValueError("part_size: S3 needs at least 5M")

    @classmethod
    def from_config(cls, raw: Any) -> S3Settings:
        """``[s3]`` read (``bbstage.settings.convert``); ``TransferError`` saying what is
        wrong (a tool's or a test's table: the daemon reads it with its config)."""
        try:
            return convert(raw, cls, "daemon config [s3]")
        except ConfigError as exc:
            raise TransferError(str(exc)) from None

    def public(self) -> S3Settings:
        """Without the account table: what a transfer's options carry."""
        return msgspec.structs.replace(self, accounts={}) if self.accounts else self


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


def allow_endpoint(s3: S3Settings | dict[str, Any], endpoint: str) -> S3Settings:
    """``[s3]`` as the config holds it, with ``endpoint`` added to ``allowed_endpoints``: for
    a tool the admin runs as themself (``bbstage bench``) against the store they name (the
    allow-list guards the site against users' endpoints)."""
    s3 = S3Settings.from_config(s3)
    return msgspec.structs.replace(s3, allowed_endpoints=(*s3.allowed_endpoints, endpoint))


def user_client(profile: str | None, raw: Any) -> tuple[Any, str | None, str]:
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


_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "0", "1"}


def mapped_credentials(s3: S3Settings, user: str) -> dict[str, str] | None:
    """The credentials the administrator mapped to ``user`` in ``[s3.accounts.<user>]``.

    Runs in the daemon (as root), which can read the root-only config and credentials file;
    the result travels to that user's worker in the transfer spec and nowhere else.
    """
    account = s3.accounts.get(user)
    if account is None:
        return None
    if account.access_key is not None and account.secret_key is not None:
        creds = {"key": str(account.access_key), "secret": str(account.secret_key)}
        if account.session_token:
            creds["token"] = str(account.session_token)
        return creds
    path = str(account.credentials_file or "/etc/bbstage/s3-credentials")
    profile = str(account.profile or user)
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
    """The S3 side of a transfer, as the worker gets it: ``[s3]`` read (``S3Settings``,
    without the account table), the directive's ``profile=``, and (only without
    ``profile=``) the credentials the administrator mapped to the job's user, or why they
    could not be read. A table given as a dict (options built by hand: tests, tools) is read
    here, when the options are made."""

    s3: S3Settings = field(default_factory=S3Settings)
    profile: str | None = None
    credentials: dict[str, str] | None = None
    credentials_error: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.s3, S3Settings):
            object.__setattr__(self, "s3", S3Settings.from_config(self.s3))


def s3_options(s3: S3Settings | dict[str, Any], uid: int, profile: str | None) -> S3Options:
    """What ``S3Backend.options`` gives a transfer's S3 side (see ``S3Options``)."""
    s3 = S3Settings.from_config(s3)
    public = s3.public()
    if profile or not s3.accounts:
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
