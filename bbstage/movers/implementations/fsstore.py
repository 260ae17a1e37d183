"""The shared layer of the stores reached through fsspec (``gcs``, ``azure``, ``https``,
``sftp``): ``StoreBackend``, the base of their backend classes, and ``StoreOptions``, the
side of a transfer each carries to the worker (its table of the daemon config, never a
credential).

``StoreBackend`` does what every such store does alike: its config table read into its
typed settings (each backend's ``Settings`` subclass; ``allowed_hosts``, the ``Hosts`` kind,
for a backend whose URLs name a host to reach, checked again before any connection,
``check_host``), its fsspec filesystem made per transfer, and
the version of each file a listing names kept (``remember``), for each range of a big file
to be read from that version alone. Beside it, the plain GETs through an fsspec HTTP
session that Azure's signed reads and HTTPS's redirected ones share (``session_get``,
``session_body``): a body handed on as it arrives, bounded, of the version asked for.
Each backend is one module beside this one; the mover of any pair of them is
``generic.mover.GenericMover``.
"""

from __future__ import annotations

import collections
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from bbstage.kinds import ConfigError, Kind, expected
from bbstage.movers.backends import Backend, Into
from bbstage.movers.base import BackendOptions, TransferError
from bbstage.movers.implementations.httpget import (
    VERSIONS,
    Changed,
    judge,
    keep,
    of_size,
    too_much,
)

RANGE_PIECE = 1 << 20  # a streamed range's bytes are handed on in pieces of up to this
HOST_ENTRY = re.compile(r"[0-9A-Za-z._-]+(?::([0-9]+))?")  # an allowed_hosts entry: host[:port]


class Hosts(tuple, Kind):  # type: ignore[type-arg]
    """``allowed_hosts``: a list of ``host`` or ``host:port``."""

    what = 'a list of host or host:port (e.g. ["data.example.org", "mirror.example.org:8443"])'

    @classmethod
    def check(cls, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise expected(cls.what, value)
        for entry in value:
            m = HOST_ENTRY.fullmatch(entry.strip()) if isinstance(entry, str) else None
            if m is None or int(m[1] or 0) > 65535:
                raise expected(f"host or host:port in the list ({cls.what})", entry)
        return tuple(value)


@dataclass(frozen=True)
class StoreOptions(BackendOptions):
    """A store's side of a transfer: its typed settings, as the daemon read its table
    (endpoints, a CA bundle); never a credential (those are the user's own, in their home).
    A dict (options built by hand: tests) is read when the filesystem is made."""

    settings: Any = None


class StoreBackend(Backend):
    """A store reached through fsspec. Subclasses name the fsspec protocol and turn the
    settings (and the URL) into the filesystem's arguments."""

    protocol: ClassVar[str]  # fsspec's name for it
    # a big file from the store: ranges of this size, this many at once (None: one stream);
    # each backend sets its own, measured against rclone on its local server
    ranges: ClassVar[tuple[int, int] | None] = (8 << 20, 8)
    env = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy")
    preload = ("fsspec", "aiohttp")

    @classmethod
    def verify(cls, settings: Any, where: str) -> None:
        bundle = getattr(settings, "ca_bundle", None)
        if bundle is not None and not os.path.isfile(bundle):
            raise ConfigError(f"{where} ca_bundle: no file {bundle}")

    @classmethod
    def of(cls, options: BackendOptions | None) -> Any:
        """The typed settings a transfer's side carries (``StoreOptions``; the defaults
        without)."""
        return cls.typed(options.settings if isinstance(options, StoreOptions) else None)

    @classmethod
    def check_host(cls, settings: Any, url: str) -> None:
        """Refuse a URL whose host:port the site has not listed in ``[section] allowed_hosts``
        (backends whose URL names the host to reach: ``port`` is its default port): a
        user's URL must not make a transfer node reach any host and port it can (a
        management network, 127.0.0.1). Checked before any connection is made."""
        cls.host_check(settings)(url)

    @classmethod
    def host_check(cls, settings: Any) -> Callable[[str], None]:
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
    def options(cls, settings: Any, uid: int, directive: dict[str, str]) -> BackendOptions | None:
        return StoreOptions(settings)

    @classmethod
    def kwargs(cls, settings: Any, url: str) -> dict[str, Any]:
        """The fsspec filesystem's arguments."""
        return {}

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        import fsspec

        settings = cls.of(options)
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
        remember(fs, found.values(), cls.version_of)
        return found

    @classmethod
    def info(cls, fs: Any, path: str) -> dict[str, Any]:
        found = super().info(fs, path)
        remember(fs, [found], cls.version_of)
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


def remember(
    fs: Any, infos: Iterable[dict[str, Any]], version_of: Callable[[dict[str, Any]], Any]
) -> None:
    """Keep the size and version (``version_of``) of each file of ``infos`` that names one,
    for its ranges (``read_range``), the last ``VERSIONS`` listed."""
    for info in infos:
        version = version_of(info) if info.get("type") == "file" else None
        if version is not None:  # (a store that names none keeps none: GCS's has no dict)
            keep(fs.versions, info["name"], (info["size"], version), VERSIONS)


def session_body(http: Any, url: str, name: str, most: int) -> bytes:
    """The whole body of one GET of ``url`` (``session_get``), of at most ``most`` bytes."""
    parts: list[bytes] = []
    session_get(http, url, name, lambda _, data: parts.append(bytes(data)), 0, None, most)
    return b"".join(parts)


def session_get(
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
