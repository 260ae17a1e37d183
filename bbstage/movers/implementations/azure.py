"""``az://`` and ``abfs://``: Azure Blob Storage through adlfs (``AzureBackend``), with the
user's own connection string (``~/.config/bbstage/azure-connection-string``, readable by
the user alone); its endpoints must be Azure's own or listed in ``[az] allowed_endpoints``.

Reads and listings are plain GETs signed for one blob or one container alone (``_signed``),
not the Azure SDK's pipeline: a big blob's ranges through fsspec's HTTP session
(``fsstore.session_get``), a small blob by ``httpget.BlockingClient``, a listing's pages
parsed by the standard library (``_listed``). A signed URL is a credential: errors name
the path alone (``_named_only``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import urllib.parse
from collections.abc import Iterator
from typing import Any

from bbstage.movers.backends import Into, UrlRule
from bbstage.movers.base import BackendOptions, TransferError
from bbstage.movers.implementations.endpoints import Endpoints, allows
from bbstage.movers.implementations.fsstore import (
    StoreBackend,
    remember,
    session_body,
    session_get,
)
from bbstage.movers.implementations.httpget import BlockingClient, Changed
from bbstage.settings import Settings

AZURE_CONNECTION = ".config/bbstage/azure-connection-string"  # under the user's home
# Azure's own Blob endpoints (the public cloud's, China's, the US government's): allowed
# over https without a line in [az] allowed_endpoints
AZURE_DOMAINS = (
    ".blob.core.windows.net",
    ".blob.core.chinacloudapi.cn",
    ".blob.core.usgovcloudapi.net",
)


class AzureSettings(Settings, frozen=True):
    """``[az]`` of the daemon config: the endpoints a user's connection string may name
    besides Azure's own."""

    allowed_endpoints: Endpoints = ()


class AzureBackend(StoreBackend):
    """``az://container/path`` (and ``abfs://``): Azure Blob Storage through adlfs, with the
    user's own connection string (``~/.config/bbstage/azure-connection-string``)."""

    name, schemes, section, protocol = "az", ("az", "abfs"), "az", "az"
    # the endpoint is the connection string's: one the site has not allowed is refused
    settings_type = AzureSettings
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
    def kwargs(cls, settings: Any, url: str) -> dict[str, Any]:
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
    def check_endpoint(cls, settings: Any, service: Any) -> None:
        """Refuse a connection string whose endpoints (the service's, and its secondary's
        if it names one) the site has not allowed: a user's connection string must not
        make a transfer node reach any host and port it can (a management network,
        127.0.0.1). Allowed: Azure's own (``https://*.blob.core.windows.net`` and its
        national clouds'), and each of ``[az] allowed_endpoints`` (``host:port`` means
        https; an ``http://`` endpoint only when listed as such). Checked before any
        request is made."""
        entries = cls.typed(settings).allowed_endpoints
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
        settings = cls.of(options)
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
                remember(fs, found.values(), cls.version_of)
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
    """``session_body`` through the plain session kept beside ``fs`` (``_plain_get``)."""
    with _named_only(name):
        return session_body(fs.plain_http, url, name, most)


def _plain_get(
    fs: Any, url: str, name: str, into: Into, start: int, end: int | None, most: int,
    version: tuple[int, str] | None = None,
) -> int:  # fmt: skip
    """``session_get`` through the plain session kept beside ``fs``
    (``AzureBackend.filesystem``), every client error named by ``name`` alone
    (``_named_only``)."""
    with _named_only(name):
        return session_get(fs.plain_http, url, name, into, start, end, most, version)


@contextlib.contextmanager
def _named_only(name: str) -> Iterator[None]:
    """An aiohttp client error as a transient failure naming ``name`` alone: aiohttp's
    messages quote the URL, and a signed one holds a signature."""
    import aiohttp

    try:
        yield
    except aiohttp.ClientError as exc:
        raise TransferError(f"{type(exc).__name__}: {name}", permanent=False) from None
