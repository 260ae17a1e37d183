"""Any enabled fsspec store, both ways and store to store: ``gs://`` (gcsfs), ``az://`` and
``abfs://`` (adlfs), ``https://`` (fsspec's HTTP, read-only), ``sftp://`` (sshfs).

One backend class per scheme (``GCSBackend``, ``AzureBackend``, ``HTTPSBackend``,
``SFTPBackend``) on ``StoreBackend``, here, and one mover, ``mover.GenericMover``, for every pair of
backends that has no fast path of its own (``Backend.movers``): it reads the source through
its backend's filesystem (a local source through ``localfs.open_source``: no symbolic link
followed) and streams it, ``chunk_size`` bytes at a time, to the destination, through the
worker: store to store never touches a disk. The rules of every transfer hold:

* local destinations: a temporary file beside the destination, renamed into place when its
  size is right (``localfs.atomic_file``), mode ``0o644`` (directories ``0o755``) and the
  source's modification time;
  a big file from a store (without ``checksum=``) is read in ranges, several at once, each
  written in place in that temporary file (the backend's ``ranges``: their size and number,
  measured per store against rclone, docs/performance.md);
* stores that make an object appear whole when its upload completes (GCS, Azure Blob) are
  written in place: the upload is the atomic step; stores that do not (SFTP) get a
  temporary name beside the destination, renamed when complete;
* ``checksum=``: the digest of the bytes read is compared with a digest of what was
  written, read back (a mismatch is retried);
* ``overwrite=``, resume (a file already current is not copied again: same size, and a
  destination at least as new as the source), cancel (between chunks), progress per chunk.

Credentials are the user's own, from their home (the worker runs as the user, ``HOME`` set):
Google's application default credentials (``~/.config/gcloud/application_default_credentials.json``,
written by ``gcloud auth application-default login``); an Azure connection string in
``~/.config/bbstage/azure-connection-string`` (one line, readable by the user alone); SSH keys
and ``known_hosts`` in ``~/.ssh`` (host keys are checked). Errors are translated in one
table (``_ERRORS``, as s3fs's ``errors.py``).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import functools
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bbstage.movers.backends import Backend, Into, UrlRule, at_once
from bbstage.movers.base import BackendOptions, TransferError
from bbstage.movers.implementations.endpoints import allows, endpoint_list, endpoint_of
from bbstage.movers.implementations.generic.httpget import (
    VERSIONS,
    BlockingClient,
    Changed,
    judge,
    keep,
    of_size,
    tls_context,
    too_much,
)

RANGE_PIECE = 1 << 20  # a streamed range's bytes are handed on in pieces of up to this
HOST_ENTRY = re.compile(r"[0-9A-Za-z._-]+(?::([0-9]+))?")  # an allowed_hosts entry: host[:port]


@dataclass(frozen=True)
class StoreOptions(BackendOptions):
    """A store's side of a transfer: its table of the daemon config (endpoints, a CA
    bundle); never a credential (those are the user's own, in their home)."""

    settings: dict[str, Any] = field(default_factory=dict)


class StoreBackend(Backend):
    """A store reached through fsspec. Subclasses name the fsspec protocol and turn the
    settings (and the URL) into the filesystem's arguments."""

    protocol: ClassVar[str]  # fsspec's name for it
    # a big file from the store: ranges of this size, this many at once (None: one stream);
    # each backend sets its own, measured against rclone on its local server
    ranges: ClassVar[tuple[int, int] | None] = (8 << 20, 8)
    settings_keys: ClassVar[frozenset[str]] = frozenset()  # keys of its config table
    env = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy")
    preload = ("fsspec", "aiohttp")

    @classmethod
    def check_settings(cls, raw: dict[str, Any]) -> None:
        for key, value in raw.items():
            if key not in cls.settings_keys:
                known = ", ".join(sorted(cls.settings_keys))
                raise TransferError(f"daemon config [{cls.section}]: unknown key {key!r} ({known})")
            if key == "allowed_hosts":
                if not isinstance(value, list):
                    raise TransferError(
                        f"daemon config [{cls.section}] allowed_hosts: {value!r} is not a list"
                        ' (write ["host", "host:port"])'
                    )
                for entry in value:
                    m = HOST_ENTRY.fullmatch(entry.strip()) if isinstance(entry, str) else None
                    if m is None or int(m[1] or 0) > 65535:
                        raise TransferError(
                            f"daemon config [{cls.section}] allowed_hosts: {entry!r} is not"
                            " host or host:port"
                        )
            elif not isinstance(value, str):
                raise TransferError(f"daemon config [{cls.section}] {key}: {value!r} is not text")
        bundle = raw.get("ca_bundle")
        if bundle is not None and not os.path.isfile(bundle):
            raise TransferError(f"daemon config [{cls.section}] ca_bundle: no file {bundle}")

    @classmethod
    def check_host(cls, settings: dict[str, Any], url: str) -> None:
        """Refuse a URL whose host:port the site has not listed in ``[section] allowed_hosts``
        (backends whose URL names the host to reach: ``port`` is its default port): a
        user's URL must not make a transfer node reach any host and port it can (a
        management network, 127.0.0.1). Checked before any connection is made."""
        cls.host_check(settings)(url)

    @classmethod
    def host_check(cls, settings: dict[str, Any]) -> Callable[[str], None]:
        """``check_host`` for these ``settings``, the site's rule built once (a client checks
        every connection it opens: 1,000 small files, 2,000 checks)."""
        rule = cls.site_rule(settings)
        if rule is None or rule.port is None:
            return lambda url: None
        judged: dict[str, str | None] = {}  # a URL's part before its path: refused host

        def check(url: str) -> None:
            # The host is in the part before the path ("//" and what follows, up to the
            # next "/"): that part says the same host whatever follows it, judged once.
            start = url.find("//")
            end = url.find("/", start + 2) if start >= 0 else -1
            head = url[:end] if end >= 0 else url
            if head in judged:
                refused = judged[head]
            else:
                try:
                    authority = urllib.parse.urlsplit(head).netloc
                except ValueError:
                    authority = ""
                refused = rule.refused_host(authority)
                if len(judged) < 64:
                    judged[head] = refused
            if refused is not None:
                raise TransferError(
                    f"{url}: host {refused} is not allowed on this site: the administrator"
                    f' may add "{refused}" to {rule.key} in the daemon config'
                )

        return check

    @classmethod
    def options(
        cls, settings: dict[str, Any], uid: int, directive: dict[str, str]
    ) -> BackendOptions | None:
        return StoreOptions(dict(settings))

    @classmethod
    def kwargs(cls, settings: dict[str, Any], url: str) -> dict[str, Any]:
        """The fsspec filesystem's arguments."""
        return {}

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        import fsspec

        settings = options.settings if isinstance(options, StoreOptions) else {}
        cls.check_host(settings, url)
        fs = fsspec.filesystem(cls.protocol, skip_instance_cache=True, **cls.kwargs(settings, url))
        # the files listed, the last VERSIONS: path -> (size, version_of); each range of
        # one is checked against that version (read_range)
        fs.versions = collections.OrderedDict()
        return fs

    @classmethod
    def version_of(cls, info: dict[str, Any]) -> Any:
        """The version of a file that a listing's ``info`` names (None: none), kept by
        ``find`` and ``info`` for ``read_range`` to read each range of a big file only from
        that version. None by default: ranges unchecked."""
        return None

    @classmethod
    def find(cls, fs: Any, root: str) -> dict[str, dict[str, Any]]:
        found = super().find(fs, root)
        _remember(fs, found.values(), cls.version_of)
        return found

    @classmethod
    def info(cls, fs: Any, path: str) -> dict[str, Any]:
        found = super().info(fs, path)
        _remember(fs, [found], cls.version_of)
        return found

    @classmethod
    def strip(cls, url: str) -> str:
        return url.split("://", 1)[1]

    @classmethod
    def unstrip(cls, url: str, path: str) -> str:
        """The URL of ``path`` (as the filesystem names it) on the store of ``url``."""
        return url.split("://", 1)[0] + "://" + path


async def _get(
    session: Any, url: str, name: str, into: Into, start: int, end: int | None, most: int,
    version: tuple[int, str] | None = None, **kwargs: Any,
) -> int:  # fmt: skip
    """One GET of ``url`` (bytes ``start`` to ``end``; ``end`` None: the whole file), its body
    handed to ``into`` as it arrives; the number of bytes read. Errors name ``name``, never
    ``url`` (Azure's carries a signature). A server that ignores ``Range`` (200) is refused
    rather than read whole; one that sends more than ``most`` bytes (the range's, or the
    whole file's planned size), before a byte past them is handed on (``too_much``). With
    ``version`` (planned size, ETag), the range is asked of that version alone
    (``If-Match``) and must be of a file of that size: else ``Changed``, before a byte is
    handed on."""
    headers = dict(kwargs.pop("headers", {}))
    if end is not None:
        headers["Range"] = f"bytes={start}-{end - 1}"
    if version is not None:
        headers["If-Match"] = version[1]
    async with session.get(url, headers=headers, **kwargs) as reply:
        if version is not None:
            _same_version(reply.status, reply.headers.getall("Content-Range", []), name, version[0])
        judge(reply.status, reply.reason or "", name, ranged=end is not None)
        at = start
        async for data in reply.content.iter_chunked(RANGE_PIECE):
            if at + len(data) - start > most:
                raise too_much(name, most)
            into(at, data)
            at += len(data)
        return at - start


def _same_version(status: int, ranges: list[str], name: str, planned: int) -> None:
    """Refuse a reply to a range asked of one version (``If-Match``) that shows the file
    changed (``Changed``): 412 (another version), or a range of a file of another size than
    ``planned`` (``ranges``: its ``Content-Range`` headers)."""
    if status == 412:
        raise Changed(name, "HTTP 412: not the version listed")
    if status == 206:
        of_size([r.encode("ascii", "replace") for r in ranges], name, planned)


def _ssl_client(bundle: str | None, allowed: dict[str, Any]) -> Any:
    """An aiohttp session factory (fsspec's ``get_client``) verifying TLS by ``tls_context``.
    Each connection's host:port is checked against ``allowed_hosts`` (``allowed``: the
    settings) before it is opened, a redirect's too."""
    import aiohttp

    context = tls_context(bundle)
    check = HTTPSBackend.host_check(allowed)

    class Connector(aiohttp.TCPConnector):
        async def connect(self, req: Any, *args: Any, **kwargs: Any) -> Any:
            check(str(req.url))
            return await super().connect(req, *args, **kwargs)

    class Bounded(aiohttp.ClientResponse):
        """A reply read whole (an index, by fsspec's listing) of at most ``INDEX_MOST``
        bytes: aiohttp's reads a body of any length into memory."""

        async def read(self) -> bytes:
            if self._body is None:
                parts, got = [], 0
                async for data in self.content.iter_any():
                    got += len(data)
                    if got > INDEX_MOST:
                        self.close()
                        raise TransferError(
                            f"{self.url}: the server sent more than {INDEX_MOST} bytes of"
                            " it (an index page that big, or one without end): stage a part"
                            " of it",
                            permanent=True,
                        )
                    parts.append(data)
                self._body = b"".join(parts)
            return await super().read()

    async def get_client(**kwargs: Any) -> Any:
        return aiohttp.ClientSession(
            connector=Connector(ssl=context), response_class=Bounded, **kwargs
        )

    return get_client


INDEX_MOST = 64 << 20  # bytes of an HTTPS index page (nginx's autoindex: ~400,000 entries)


class GCSBackend(StoreBackend):
    """``gs://bucket/key``: Google Cloud Storage through gcsfs, with the user's application
    default credentials. ``[gs] endpoint_url`` for a private endpoint (or the emulator, with
    ``anonymous = "true"`` for tests)."""

    name, schemes, section, protocol = "gs", ("gs",), "gs", "gs"
    settings_keys = frozenset({"endpoint_url", "project", "anonymous"})
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
    def kwargs(cls, settings: dict[str, Any], url: str) -> dict[str, Any]:
        args: dict[str, Any] = {"token": "anon" if settings.get("anonymous") == "true" else None}
        if settings.get("endpoint_url"):
            args["endpoint_url"] = settings["endpoint_url"]
        if settings.get("project"):
            args["project"] = settings["project"]
        return args

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        """gcsfs's plain JSON-API filesystem (``gcsfs.core``): the package's default class
        (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT) first asks each bucket's layout over gRPC, which
        a private endpoint or the emulator does not answer (a minute of retries per bucket)."""
        from gcsfs.core import GCSFileSystem

        settings = options.settings if isinstance(options, StoreOptions) else {}
        args = cls.kwargs(settings, url)
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


AZURE_CONNECTION = ".config/bbstage/azure-connection-string"  # under the user's home
# Azure's own Blob endpoints (the public cloud's, China's, the US government's): allowed
# over https without a line in [az] allowed_endpoints
AZURE_DOMAINS = (
    ".blob.core.windows.net",
    ".blob.core.chinacloudapi.cn",
    ".blob.core.usgovcloudapi.net",
)


class AzureBackend(StoreBackend):
    """``az://container/path`` (and ``abfs://``): Azure Blob Storage through adlfs, with the
    user's own connection string (``~/.config/bbstage/azure-connection-string``)."""

    name, schemes, section, protocol = "az", ("az", "abfs"), "az", "az"
    # the endpoint is the connection string's: one the site has not allowed is refused
    settings_keys = frozenset({"allowed_endpoints"})
    url_rule = UrlRule(
        what="Azure container",
        rules="container names have 3-63 characters a-z 0-9 - and start and end with a"
        " letter or digit",
        chars=("a-z", "0-9", "-"),
        ends=("a-z", "0-9"),
        low=3,
        high=63,
    )
    preload = ("fsspec", "aiohttp", "adlfs")
    # a big upload in 8 MiB blocks (adlfs stages the blocks of each write at once: two of a
    # 16 MiB write): 1 GiB to Azurite, 3 runs each beside rclone's 131-162 MB/s: 8 MiB 136-191
    # MB/s with 0.56-0.65 s of CPU, 4 MiB 143-191 (0.7 s), 16 MiB 111-156, adlfs's 50 MiB
    # 105-153 (1.7-2.9 s); bigger when a blob would need more than Azure's 50,000 blocks
    put_block, put_blocks_max = 8 << 20, 50_000
    # 1 GiB from Azurite in signed plain GETs (read_range), 8 runs each beside rclone's, the
    # median of each run's ratio in 3 sweeps: 64 MiB x 8 1.15-1.18x (best 909 MB/s, client
    # CPU 0.44 s), 64 x 4 1.06-1.09, 128 x 4 1.10, 32 x 8 1.08, 16 x 4 0.96-0.99 (0.50 s);
    # 128 MiB: 64 x 8 2.1x, 16 x 4 1.9x (rclone reads it in one stream). Through the Azure
    # SDK (cat_file), 16 x 4 had been 290-376 MB/s with 2.1-2.8 s of CPU
    ranges = (64 << 20, 8)

    @classmethod
    def kwargs(cls, settings: dict[str, Any], url: str) -> dict[str, Any]:
        path = os.path.join(os.path.expanduser("~"), AZURE_CONNECTION)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                if os.fstat(f.fileno()).st_mode & 0o077:
                    raise TransferError(
                        f"{path} is readable by others: chmod 600 it (it holds your key)"
                    )
                text = f.read().strip()
        except OSError as exc:
            raise TransferError(
                f"no Azure credentials: put your storage account's connection string in {path}"
                f" ({exc.strerror})"
            ) from None
        return {"connection_string": text}

    @classmethod
    def check_settings(cls, raw: dict[str, Any]) -> None:
        try:
            endpoint_list(raw.get("allowed_endpoints", []))
        except ValueError as exc:
            raise TransferError(f"daemon config [az] allowed_endpoints: {exc}") from None
        super().check_settings({k: v for k, v in raw.items() if k != "allowed_endpoints"})

    @classmethod
    def check_endpoint(cls, settings: dict[str, Any], service: Any) -> None:
        """Refuse a connection string whose endpoints (the service's, and its secondary's
        if it names one) the site has not allowed: a user's connection string must not
        make a transfer node reach any host and port it can (a management network,
        127.0.0.1). Allowed: Azure's own (``https://*.blob.core.windows.net`` and its
        national clouds'), and each of ``[az] allowed_endpoints`` (``host:port`` means
        https; an ``http://`` endpoint only when listed as such). Checked before any
        request is made."""
        entries = settings.get("allowed_endpoints", [])
        for host in (service.primary_hostname, service.secondary_hostname):
            url = f"{service.scheme}://{host}"  # (Azurite's names the account after a "/")
            if host and not allows(entries, url, AZURE_DOMAINS):
                raise TransferError(
                    f"Azure endpoint {url} (the connection string in ~/{AZURE_CONNECTION})"
                    " is not allowed on this site: the administrator may add it to [az]"
                    " allowed_endpoints in the daemon config"
                )

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        """adlfs's filesystem, its endpoints allowed (``check_endpoint``); without a proxy
        variable in the environment, its client does not look for one (nor for
        ``~/.netrc``) at each request: two hops to a thread per request, a quarter of a
        small blob's time (300 x 64 KiB from Azurite, 8 at once: 0.72 s with them,
        0.53-0.58 s without). Neither client follows a redirect (Azure's service sends
        none): a signed GET's answer elsewhere is the error it is."""
        from fsspec.implementations.http import HTTPFileSystem

        fs = super().filesystem(options, url)
        settings = options.settings if isinstance(options, StoreOptions) else {}
        proxied = any(os.environ.get(name) for name in cls.env)
        if not proxied:
            from azure.storage.blob.aio import BlobServiceClient

            fs.service_client = BlobServiceClient.from_connection_string(
                fs.connection_string, use_env_settings=False, permit_redirects=False
            )
        cls.check_endpoint(settings, fs.service_client)
        # the session of the signed GETs (read_range, read): fsspec's HTTP filesystem,
        # which closes it; through the environment's proxy, as the SDK's requests
        fs.plain_http = HTTPFileSystem(
            skip_instance_cache=True,
            client_kwargs={"trust_env": proxied},
            allow_redirects=False,
        )
        # small blobs' GETs in the worker's threads, where no proxy is to be used (it reads
        # none): 1,000 x 64 KiB from Azurite, 6 runs each beside rclone, the median of each
        # run's ratio: 1.13-1.17x, against 1.05-1.08x through the session above. A big
        # blob's ranges stay there: 1.19x against 1.00x (Azurite speaks plain HTTP; there
        # is no TLS to decrypt in parallel)
        fs.blocking = None if proxied else BlockingClient()
        fs.container_urls = {}  # the SDK's URL of each container (_signed)
        return fs

    @classmethod
    def version_of(cls, info: dict[str, Any]) -> Any:
        """A blob's ETag (adlfs's, or ``_listed``'s), quoted: ``If-Match`` of its ranges."""
        return info.get("etag")

    @classmethod
    def read_range(cls, fs: Any, path: str, start: int, end: int, into: Into) -> int:
        """One ranged GET, signed for this blob alone (``_signed``), its body handed on as it
        arrives: the Azure SDK reads each body whole, through a Python pipeline of policies,
        twice the CPU of a plain GET on the CPUs Azurite needs too.

        A blob listed here (``find``, ``info``) is read only in the version it had then
        (``If-Match`` its ETag) and at that size (``Content-Range``): changed since, a range
        is refused, transiently, never staged of two versions nor at a size it no longer
        has; the next try asks the version it has now (a blob replaced, its size kept, is
        read again whole; one of another size is refused for it)."""
        signed = _signed(fs, *fs.split_path(path)[:2])
        if signed is None:
            return super().read_range(fs, path, start, end, into)
        version = fs.versions.get(path)
        try:
            return _plain_get(fs, signed, path, into, start, end, end - start, version)
        except Changed:
            assert version is not None
            try:  # the version it has now, for the next try
                now = fs.info(path, refresh=True)["etag"]
                fs.versions[path] = (version[0], now)
            except Exception:  # gone, or unreadable: the next try says which
                fs.versions.pop(path, None)
            raise

    @classmethod
    def read(cls, fs: Any, path: str, size: int) -> bytes:
        """A small blob in one plain GET, signed as ``read_range``'s (300 x 64 KiB from
        Azurite, 8 at once: 0.12 s of CPU against the SDK's 0.23), in this thread
        (``httpget.BlockingClient``) where no proxy is to be used."""
        signed = _signed(fs, *fs.split_path(path)[:2])
        if signed is None:
            return super().read(fs, path, size)
        if fs.blocking is not None:
            body = fs.blocking.read(signed, path, size)
            if body is not None:  # (None: redirected; the session follows)
                return body
        return _plain_body(fs, signed, path, size)

    @classmethod
    def find(cls, fs: Any, root: str) -> dict[str, dict[str, Any]]:
        """The blobs below ``root``, listed by plain GETs signed for listing that container
        alone (``_signed``), each page parsed by the standard library's XML parser
        (``_listed``): adlfs's ``find`` has the SDK build a model of every blob before the
        first copy starts (1,000 blobs from Azurite: 0.015 s of CPU and 0.06 s, against
        0.15 s and 0.2 s). The SDK lists for a credential that cannot sign."""
        container, prefix, _ = fs.split_path(root)
        url = _signed(fs, container, None)
        if url is None:
            return super().find(fs, root)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        found: dict[str, dict[str, Any]] = {}
        marker = ""
        while True:
            query = {"restype": "container", "comp": "list", "include": "metadata",
                     "maxresults": LIST_PAGE, "prefix": prefix}  # fmt: skip
            if marker:
                query["marker"] = marker
            text = urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
            page = _plain_body(fs, f"{url}&{text}", root, LIST_PAGE_BYTES)
            marker = _listed(page, f"{container}/{prefix}", found)
            if not marker:
                _remember(fs, found.values(), cls.version_of)
                return found


SIGNED_FOR = 3600  # seconds a signature is valid
LIST_PAGE = 5000  # blobs per page of a listing (Azure's most)
# ...and the most bytes one page may have (a blob's entry, with a name of up to 1,024
# characters and metadata of up to 8 KiB, is under 16 KiB): a bigger one is refused
LIST_PAGE_BYTES = LIST_PAGE << 14


def _signed(fs: Any, container: str, blob: str | None) -> str | None:
    """The URL of ``blob`` with a shared access signature that lets its holder read that
    blob alone (``blob`` None: list ``container`` alone), for ``SIGNED_FOR`` seconds, made
    from the account key of the user's connection string (or the signature the connection
    string holds); None when the credential is neither (the SDK serves, then). Never
    logged: it is a credential. The container's URL is the SDK's, a blob's name quoted as
    the SDK quotes it: the SDK's client per blob cost 74 µs of CPU a read, this 21."""
    from azure.storage.blob import generate_blob_sas, generate_container_sas

    service = fs.service_client
    if container not in fs.container_urls:
        fs.container_urls[container] = service.get_container_client(container).url
    base, _, own = fs.container_urls[container].partition("?")
    if blob is not None:
        base += "/" + urllib.parse.quote(blob, safe="~/")
    key = getattr(service.credential, "account_key", None)
    if key:
        expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=SIGNED_FOR)
        sas = (
            generate_container_sas(
                service.account_name, container, account_key=key, permission="l", expiry=expiry
            )
            if blob is None
            else generate_blob_sas(
                service.account_name, container, blob, account_key=key, permission="r",
                expiry=expiry,
            )
        )  # fmt: skip
        return f"{base}?{sas}"
    return f"{base}?{own}" if own else None


def _remember(
    fs: Any, infos: Iterable[dict[str, Any]], version_of: Callable[[dict[str, Any]], Any]
) -> None:
    """Keep the size and version (``version_of``) of each file of ``infos`` that names one,
    for its ranges (``read_range``), the last ``VERSIONS`` listed."""
    for info in infos:
        version = version_of(info) if info.get("type") == "file" else None
        if version is not None:  # (a store that names none keeps none: GCS's has no dict)
            keep(fs.versions, info["name"], (info["size"], version), VERSIONS)


def _listed(page: bytes, top: str, found: dict[str, dict[str, Any]]) -> str:
    """Add the blobs of one page of Azure's List Blobs answer (of ``top``: container/prefix)
    to ``found`` as adlfs's ``find`` names them (``container/name``), with every directory
    between ``top`` and each blob; the marker of the next page ("" for the last). A blob whose
    metadata marks it a directory (``is_directory``, ``hdi_isfolder``: Data Lake's and
    adlfs's) is one; a name with characters XML cannot hold comes percent-encoded."""
    from email.utils import parsedate_to_datetime
    from xml.etree import ElementTree

    try:
        answer = ElementTree.fromstring(page)
    except ElementTree.ParseError as exc:
        message = f"{top}: the store's listing is not XML ({exc})"
        raise TransferError(message, permanent=False) from None
    container = top.split("/", 1)[0]
    for blob in answer.iter("Blob"):
        name = blob.find("Name")
        if name is None or not name.text:
            continue
        text = urllib.parse.unquote(name.text) if name.get("Encoded") == "true" else name.text
        path = f"{container}/{text}".rstrip("/")
        found_meta = blob.find("Metadata")
        meta = {m.tag.lower(): m.text for m in found_meta} if found_meta is not None else {}
        flag = meta.get("is_directory") or meta.get("hdi_isfolder")
        modified = blob.findtext("Properties/Last-Modified")
        found[path] = {
            "name": path,
            "type": "directory" if flag == "true" else "file",
            "size": int(blob.findtext("Properties/Content-Length") or 0),
            "last_modified": parsedate_to_datetime(modified) if modified else None,
        }
        etag = (blob.findtext("Properties/Etag") or "").strip('"')
        if etag:  # quoted, as adlfs gives it
            found[path]["etag"] = f'"{etag}"'
        parent = path
        while (parent := parent.rpartition("/")[0]).startswith(top) and parent not in found:
            found[parent] = {"name": parent, "type": "directory", "size": 0}
    return answer.findtext("NextMarker") or ""


def _plain_body(fs: Any, url: str, name: str, most: int) -> bytes:
    """``_session_body`` through the plain session kept beside ``fs`` (``_plain_get``)."""
    with _named_only(name):
        return _session_body(fs.plain_http, url, name, most)


def _plain_get(
    fs: Any, url: str, name: str, into: Into, start: int, end: int | None, most: int,
    version: tuple[int, str] | None = None,
) -> int:  # fmt: skip
    """``_session_get`` through the plain session kept beside ``fs``
    (``AzureBackend.filesystem``), every client error named by ``name`` alone
    (``_named_only``)."""
    with _named_only(name):
        return _session_get(fs.plain_http, url, name, into, start, end, most, version)


@contextlib.contextmanager
def _named_only(name: str) -> Iterator[None]:
    """An aiohttp client error as a transient failure naming ``name`` alone: aiohttp's
    messages quote the URL, and a signed one holds a signature."""
    import aiohttp

    try:
        yield
    except aiohttp.ClientError as exc:
        raise TransferError(f"{type(exc).__name__}: {name}", permanent=False) from None


def _session_body(http: Any, url: str, name: str, most: int) -> bytes:
    """The whole body of one GET of ``url`` (``_session_get``), of at most ``most`` bytes."""
    parts: list[bytes] = []
    _session_get(http, url, name, lambda _, data: parts.append(bytes(data)), 0, None, most)
    return b"".join(parts)


def _session_get(
    http: Any, url: str, name: str, into: Into, start: int, end: int | None, most: int,
    version: tuple[int, str] | None = None,
) -> int:  # fmt: skip
    """``_get`` through the aiohttp session of fsspec's HTTP filesystem ``http``, from any
    thread but its event loop's (it follows a redirect; HTTPS's checks each host)."""
    from fsspec.asyn import sync

    async def get() -> int:
        session = await http.set_session()
        return await _get(session, url, name, into, start, end, most, version, **http.kwargs)

    return int(sync(http.loop, get))


class HTTPSBackend(StoreBackend):
    """``https://host/path``: a source only, listed through fsspec's HTTP (aiohttp), read by
    ``httpget.BlockingClient``; TLS verified against the system's CAs and ``[https]
    ca_bundle``."""

    name, schemes, section, protocol = "https", ("https",), "https", "https"
    read_only = True
    settings_keys = frozenset({"ca_bundle", "allowed_hosts"})
    port = 443
    # 64 MiB x 4, each range read in its own thread over libcurl (BlockingClient). 1 GiB
    # from nginx on this machine, in-process as the bench, beside rclone (4 streams), the
    # median of each run's ratio, 8-10 runs a sweep (2026-11-29): 64 x 4 1.09, 1.07, 0.97,
    # 1.08; 64 x 2 1.00, 0.90, 1.02 (and 0.93 in the whole bench); 32 x 4 1.11, 1.01; 16 x 4
    # 1.02; 32 x 6 1.02; 128 x 2 0.89; 256 x 4 1.06. Two streams had been best through
    # fsspec's event loop (32 x 4 0.83-0.89 there): libcurl's handles each do less. A server
    # across a network, with CPUs of its own, gains more from 4 than this one, which shares
    # the 2 CPUs with its client.
    ranges = (64 << 20, 4)
    url_rule = UrlRule(
        what="host",
        rules="host names have 1-255 characters a-z A-Z 0-9 . - and an optional :port",
        chars=("a-z", "A-Z", "0-9", ".", "-", ":"),
        ends=("a-z", "A-Z", "0-9"),
        low=1,
        high=255,
    )

    @classmethod
    def kwargs(cls, settings: dict[str, Any], url: str) -> dict[str, Any]:
        return {
            "get_client": _ssl_client(settings.get("ca_bundle"), settings),
            "simple_links": False,
        }

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        """fsspec's HTTP filesystem (listings, sizes), and beside it the client of its
        reads (``httpget.BlockingClient``), verifying and checking hosts as fsspec's
        client does."""
        fs = super().filesystem(options, url)
        settings = options.settings if isinstance(options, StoreOptions) else {}
        fs.blocking = BlockingClient(settings.get("ca_bundle"), cls.host_check(settings))
        fs.urls = collections.OrderedDict()  # path -> its URL, encoded (_url)
        return fs

    @classmethod
    def read(cls, fs: Any, path: str, size: int) -> bytes:
        """A small file as its size's request brought it, or by one GET (``httpget.
        BlockingClient``; the one ``prefetch`` started, if it did); one the server
        redirects, through fsspec's client, which checks the host of every connection it
        opens."""
        body = fs.blocking.read(_url(fs, path), path, size)
        return body if body is not None else _session_body(fs, fs.encode_url(path), path, size)

    @classmethod
    def info(cls, fs: Any, path: str) -> dict[str, Any]:
        """A file's size by a GET of its first bytes (``infos``)."""
        return next(cls.infos(fs, [path]))

    @classmethod
    def infos(cls, fs: Any, paths: list[str]) -> Iterator[dict[str, Any]]:
        """The files' sizes by GETs of their first bytes, all asked at once on one thread
        (``httpget.BlockingClient.sizes``), each answered as it comes; a small file's bytes
        come with its size, kept for ``read``: one request a file where a HEAD and a GET
        were two. A redirect, an error, or a reply that does not say the size plainly is
        asked again through fsspec's ``info`` (its rules: the redirect's host checked, a GET
        where a HEAD tells nothing, any failure a missing file): from the first such file
        on, the rest are answered 16 at once (a server redirects or refuses all its
        requests, often)."""
        sizes = fs.blocking.sizes((_url(fs, path), path) for path in paths)
        fsspec_info = super().info

        def info(path: str, size: int | None) -> dict[str, Any]:
            if size is None:
                return fsspec_info(fs, path)
            return {"name": path, "size": size, "type": "file"}

        for at, (path, size) in enumerate(zip(paths, sizes, strict=True)):
            if size is None:
                rest = list(zip(paths[at:], [None, *sizes], strict=True))
                yield from at_once(lambda item: info(*item), rest)
                return
            yield info(path, size)

    @classmethod
    def find(cls, fs: Any, root: str) -> dict[str, dict[str, Any]]:
        """Every file and directory below ``root``, one listing (a GET of its index) per
        directory: fsspec's ``find`` first asks whether ``root`` is a directory (its
        listing) and its info (a HEAD and a GET), to name ``root`` itself, which the mover
        does not use, then lists it again (1,000 files: 4 requests and 25 ms, against 1
        and 6). A directory listed that cannot be listed fails the listing, where
        fsspec's leaves its files out; ``root`` missing is nothing found."""
        from fsspec.asyn import sync

        async def walk() -> dict[str, dict[str, Any]]:
            found: dict[str, dict[str, Any]] = {}
            # (fsspec's _walk drops its on_error="raise" below the root)
            below = [(root, 0)]  # a directory, and how deep below root
            while below:
                directory, depth = below.pop()
                try:
                    listing = await fs._ls(directory, detail=True)
                except FileNotFoundError:
                    if directory == root:
                        return {}
                    raise
                for info in listing:
                    name = info["name"].rstrip("/")
                    if name != directory and name.rpartition("/")[2] not in (".", ".."):
                        found[info["name"]] = info  # (not a file listed as itself, nor ./)
                        if info["type"] == "directory":
                            if depth == TREE_DEEPEST:
                                raise _unending(root, f"directories {TREE_DEEPEST} deep")
                            below.append((name, depth + 1))
                if len(found) > TREE_MOST:
                    raise _unending(root, f"{TREE_MOST} files and directories")
            return found

        return dict(sync(fs.loop, walk))

    @classmethod
    def prefetch(cls, fs: Any, path: str, size: int) -> None:
        """A small file's GET (of what its size's request did not bring) started now,
        with the others' on one thread, up to 16 at once (``httpget.BlockingClient.fetch``),
        for ``read`` to take."""
        fs.blocking.fetch(_url(fs, path), path, size)

    @classmethod
    def close(cls, fs: Any) -> None:
        fs.blocking.close()

    @classmethod
    def read_range(cls, fs: Any, path: str, start: int, end: int, into: Into) -> int:
        """One ranged GET in this thread (``httpget.BlockingClient``), its body handed on
        as it arrives, not gathered first (fsspec's ``cat_file`` joins a range's body into
        one string: a copy of every byte and a quarter more CPU per GiB, on the CPUs the
        server needs too). A server that ignores ``Range`` (200) is refused rather than
        read whole. A redirected range is read through fsspec's client, as ``read``."""
        got = fs.blocking.read_range(_url(fs, path), path, start, end, into)
        if got is not None:
            return int(got)
        return _session_get(fs, fs.encode_url(path), path, into, start, end, end - start)

    @classmethod
    def strip(cls, url: str) -> str:
        return url

    @classmethod
    def unstrip(cls, url: str, path: str) -> str:
        return path

    @classmethod
    def name_of(cls, rel: str) -> str:
        """A listing's links are URLs: percent-encoded (``a%20b`` is the file ``a b``)."""
        from urllib.parse import unquote

        return unquote(rel)


def _unending(root: str, what: str) -> TransferError:
    """The error of an HTTPS tree whose indexes name more than ``what``."""
    return TransferError(
        f"{root}: its indexes name more than {what} (a tree that big, or indexes a server"
        " generates without end): stage a part of it",
        permanent=True,
    )


def _url(fs: Any, path: str) -> str:
    """``path`` as fsspec's HTTP filesystem encodes it (yarl), for libcurl: the last
    ``URLS`` kept, as a file's URL is asked for its size, its read ahead and its read (25
    us each, on the one thread that walks the tree: a tenth of 1,000 small files' time)."""
    urls: collections.OrderedDict[str, str] = fs.urls
    url = urls.get(path)
    if url is None:
        url = str(fs.encode_url(path))
        keep(urls, path, url, URLS)
    return url


URLS = 4096  # files whose encoded URL an HTTPS filesystem keeps (_url)
# the most an HTTPS tree's indexes may name (HTTPSBackend.find): a server can generate
# indexes without end, and the worker keeps each entry (each listing is a request)
TREE_MOST = 1_000_000  # files and directories
TREE_DEEPEST = 128  # directories below the root (Linux: PATH_MAX, 4,096 bytes, ~2,000)


# The ciphers an SFTP connection asks for first where the CPU has AES instructions, before
# asyncssh's own order (chacha20-poly1305 first), as rclone's Go client does: 1 GiB up to the
# local sshd 1.9-2.1 s against 3.0-3.9 s (1.5 s of the client's CPU against 2.5-3.0 s; rclone
# 3.4 s), and the server decrypts faster too.
AES_FIRST = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"


@functools.cache
def cpu_has_aes(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Does this CPU have AES instructions (x86's ``aes`` flag, Arm's ``aes`` feature)?"""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            return any(
                line.split(":", 1)[0].strip() in ("flags", "Features")
                and "aes" in line.split(":", 1)[1].split()
                for line in f
            )
    except OSError:
        return False


class SFTPBackend(StoreBackend):
    """``sftp://[user@]host[:port]/path``: through sshfs (asyncssh), with the user's keys and
    ``known_hosts`` in ``~/.ssh`` (an unknown host key is refused)."""

    name, schemes, section, protocol = "sftp", ("sftp",), "sftp", "sftp"
    atomic_put = False
    port = 22
    # 32 MiB x 4, each read in parallel blocks (read_range): 1 GiB, 3 runs each beside rclone's
    # 287-308 MB/s: 32 x 4 606 MB/s, 64 x 2 606, 128 x 2 623, 1024 x 1 626 (1.6 s of CPU
    # against rclone's 3.2-3.6 s); a seeked handle's joined reads had been 240 (4.5 s)
    ranges = (32 << 20, 4)
    settings_keys = frozenset({"allowed_hosts"})
    env = ()
    preload = ("fsspec", "sshfs")
    url_rule = UrlRule(
        what="host",
        rules="write [user@]host[:port] with a-z A-Z 0-9 . _ - in names",
        chars=("a-z", "A-Z", "0-9", ".", "_", "-", "@", ":"),
        ends=("a-z", "A-Z", "0-9"),
        low=1,
        high=255,
    )

    @classmethod
    def read_range(cls, fs: Any, path: str, start: int, end: int, into: Into) -> int:
        """asyncssh's parallel reads of the range (``read_parallel``), each block handed on
        at its offset as it arrives (sshfs's ``cat_file`` reads whole files; a seeked
        handle's ``read`` joins the blocks into one string first: 1 GiB 240 MB/s with 4.5 s
        of CPU, against rclone's 280-300). The channel comes from sshfs's pool, the errors
        through sshfs's own translation (``wrap_exceptions``).

        A file listed here (``find``, ``info``) must be, after its range is read, as it was
        listed: the same size and modification time (``stat`` of the open file; SFTP
        names whole seconds), else refused, transiently, never staged of two versions nor
        at a size it no longer has; the next try reads the version it has now (a file
        rewritten, its size kept, is read again whole; one of another size is refused for
        it). A file rewritten in place within the second it was listed in, its size kept,
        is not seen changed."""
        from fsspec.asyn import sync
        from sshfs.utils import wrap_exceptions

        @wrap_exceptions
        async def read() -> tuple[int, Any]:
            got = 0
            async with fs._pool.get() as channel, channel.open(path, "rb") as f:
                async for offset, data in await f.read_parallel(end - start, start):
                    into(offset, data)
                    got += len(data)
                return got, await f.stat()

        version = fs.versions.get(path)
        got, now = sync(fs.loop, read)
        if version is not None and (now.size, int(now.mtime or 0)) != version:
            fs.versions[path] = (version[0], int(now.mtime or 0))  # for the next try
            if now.size != version[0]:
                raise Changed(path, f"it has {now.size} bytes, planned {version[0]}")
            raise Changed(path, "modified since it was listed")
        return int(got)

    @classmethod
    def version_of(cls, info: dict[str, Any]) -> Any:
        """A file's modification time, in whole seconds as SFTP names it."""
        mtime = info.get("mtime")
        return int(mtime.timestamp()) if mtime is not None else None

    @classmethod
    def write(cls, fs: Any, path: str, data: bytes) -> None:
        """Open, write, close on a channel of sshfs's pool: three requests. sshfs's
        ``pipe_file`` first makes the parent directories, asking for each part of the path
        a ``mkdir`` and a ``stat`` (14 more requests for a file 7 deep: 1,000 x 64 KiB up
        took 5.0 s, 1.8-2.0 s this way, rclone 4.5-4.9 s). The mover has made the directory,
        once per transfer; one removed since is made again here, as ``pipe_file`` would."""
        from asyncssh import SFTPNoSuchFile
        from fsspec.asyn import sync
        from sshfs.utils import wrap_exceptions

        @wrap_exceptions
        async def write() -> None:
            async with fs._pool.get() as channel:
                try:
                    f = await channel.open(path, "wb")
                except SFTPNoSuchFile:  # the directory removed since
                    await channel.makedirs(os.path.dirname(path), exist_ok=True)
                    f = await channel.open(path, "wb")
                async with f:
                    await f.write(data)

        sync(fs.loop, write)
        fs.invalidate_cache(path)

    @classmethod
    def kwargs(cls, settings: dict[str, Any], url: str) -> dict[str, Any]:
        from fsspec.utils import infer_storage_options

        where = infer_storage_options(url)
        args: dict[str, Any] = {"host": where["host"]}
        if where.get("port"):
            args["port"] = int(where["port"])
        if where.get("username"):
            args["username"] = where["username"]
        ssh = os.path.join(os.path.expanduser("~"), ".ssh")
        args["known_hosts"] = os.path.join(ssh, "known_hosts")
        # not the user's ~/.ssh/config: its HostName, Port, ProxyJump or ProxyCommand would
        # reach another host than the one checked against [sftp] allowed_hosts
        args["config"] = []
        if cpu_has_aes():
            args["encryption_algs"] = AES_FIRST
        return args

    @classmethod
    def strip(cls, url: str) -> str:
        rest = url.split("://", 1)[1]
        return "/" + rest.split("/", 1)[1] if "/" in rest else "/"

    @classmethod
    def unstrip(cls, url: str, path: str) -> str:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://{rest.split('/', 1)[0]}{path}"
