"""``https://``: a read-only source (``HTTPSBackend``), listed through fsspec's HTTP
filesystem (aiohttp: an index page per directory) and read by ``httpget.BlockingClient``
(libcurl); TLS verified against the system's CAs and ``[https] ca_bundle``, each host
checked against ``[https] allowed_hosts`` before it is reached, a redirect's too.

A server is the user's choice: everything it sends is bounded (an index page's bytes,
``INDEX_MOST``; a tree's entries and depth, ``TREE_MOST``, ``TREE_DEEPEST``; a file's bytes
by its planned size).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from bbstage.kinds import FilePath
from bbstage.movers.backends import Into, UrlRule, at_once
from bbstage.movers.base import BackendOptions, TransferError
from bbstage.movers.implementations.fsstore import (
    Hosts,
    StoreBackend,
    session_body,
    session_get,
)
from bbstage.movers.implementations.httpget import BlockingClient, keep, tls_context
from bbstage.settings import Settings


class HTTPSSettings(Settings, frozen=True):
    """``[https]`` of the daemon config: a CA bundle besides the system's, and the hosts a
    URL may name."""

    ca_bundle: FilePath | None = None
    allowed_hosts: Hosts = ()


class HTTPSBackend(StoreBackend):
    """``https://host/path``: a source only, listed through fsspec's HTTP (aiohttp), read by
    ``httpget.BlockingClient``; TLS verified against the system's CAs and ``[https]
    ca_bundle``."""

    name, schemes, section, protocol = "https", ("https",), "https", "https"
    read_only = True
    settings_type = HTTPSSettings
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
    def kwargs(cls, settings: Any, url: str) -> dict[str, Any]:
        settings = cls.typed(settings)
        return {
            "get_client": _ssl_client(_bundle(settings), settings),
            "simple_links": False,
        }

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        """fsspec's HTTP filesystem (listings, sizes), and beside it the client of its
        reads (``httpget.BlockingClient``), verifying and checking hosts as fsspec's
        client does."""
        fs = super().filesystem(options, url)
        settings = cls.of(options)
        fs.blocking = BlockingClient(_bundle(settings), cls.host_check(settings))
        fs.urls = collections.OrderedDict()  # path -> its URL, encoded (_url)
        return fs

    @classmethod
    def read(cls, fs: Any, path: str, size: int) -> bytes:
        """A small file as its size's request brought it, or by one GET (``httpget.
        BlockingClient``; the one ``prefetch`` started, if it did); one the server
        redirects, through fsspec's client, which checks the host of every connection it
        opens."""
        body = fs.blocking.read(_url(fs, path), path, size)
        return body if body is not None else session_body(fs, fs.encode_url(path), path, size)

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
        return session_get(fs, fs.encode_url(path), path, into, start, end, end - start)

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


def _bundle(settings: HTTPSSettings) -> str | None:
    return str(settings.ca_bundle) if settings.ca_bundle else None


def _ssl_client(bundle: str | None, allowed: HTTPSSettings) -> Any:
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
