"""The endpoints a site allows a user's own store credentials to name (``[s3]
allowed_endpoints``, ``[az] allowed_endpoints``): one way to read an entry (``endpoint_of``)
and a list of them (``endpoint_list``), and one rule of which endpoints they allow
(``allows``), shared by the backends whose endpoint the user's configuration chooses."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable
from typing import Any

from bbstage.kinds import Kind, expected


def endpoint_of(value: Any) -> tuple[str, str, int]:
    """(scheme, host, port) of a store's endpoint, as an allow-list of the daemon config
    names it (``[s3] allowed_endpoints``, ``[az] allowed_endpoints``): a URL
    (``https://s3.example.org``, ``http://10.0.0.5:7480``) or ``host:port`` (https);
    ValueError if it is neither."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a URL (https://host[:port]) or host:port")
    url = urllib.parse.urlsplit(value if "://" in value else f"https://{value}")
    try:
        port = url.port
    except ValueError:
        port = None
        url = url._replace(scheme="")  # refused below
    host = url.hostname or ""
    if url.scheme not in ("http", "https") or not re.fullmatch(r"[0-9a-z._:-]+", host):
        raise ValueError(f"{value!r} is not a URL (https://host[:port]) or host:port")
    return url.scheme, host, port or (443 if url.scheme == "https" else 80)


def endpoint_list(value: Any) -> tuple[str, ...]:
    """An ``allowed_endpoints`` value of the daemon config: a list of ``endpoint_of``
    entries; ValueError saying what to write if it is not one."""
    if not isinstance(value, list):
        raise ValueError(f"{value!r}: use a list of URLs or host:port")
    for each in value:
        endpoint_of(each)  # ValueError if it is not one
    return tuple(value)


def allows(entries: Iterable[str], endpoint: str, own: tuple[str, ...] = ()) -> bool:
    """Is ``endpoint`` (the one a user's client would use) allowed: one of ``entries``
    (``endpoint_of``: ``host:port`` means https; an ``http://`` endpoint only when listed
    as such), or https on a host that ends with one of ``own`` (the store's own domains,
    ``".amazonaws.com"``)? An endpoint that is not a URL is not."""
    try:
        wanted = endpoint_of(endpoint)
    except ValueError:
        return False
    if wanted[0] == "https" and wanted[1].endswith(own):
        return True
    return wanted in {endpoint_of(e) for e in entries}


class Endpoint(str, Kind):
    """A store's endpoint (``endpoint_of``)."""

    what = "a URL (https://host[:port]) or host:port"

    @classmethod
    def check(cls, value: Any) -> str:
        try:
            endpoint_of(value)
        except ValueError:
            raise expected(cls.what, value) from None
        return str(value)


class Endpoints(tuple, Kind):  # type: ignore[type-arg]
    """``allowed_endpoints``: a list of ``Endpoint``."""

    what = 'a list of URLs or host:port (e.g. ["https://s3.example.org", "10.0.0.5:7480"])'

    @classmethod
    def check(cls, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise expected(cls.what, value)
        for each in value:
            if not isinstance(each, str):
                raise expected(cls.what, value)
            Endpoint.check(each)
        return tuple(value)
