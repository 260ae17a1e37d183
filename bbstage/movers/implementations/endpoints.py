"""The endpoints a site allows a user's own store credentials to name (``[s3]
allowed_endpoints``, ``[az] allowed_endpoints``): one way to read an entry, shared by the
backends whose endpoint the user's configuration chooses."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any


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
