"""LIST pages without botocore's response parser: one GET per page (signed and sent as
``direct``'s are, in a thread), its XML read with ElementTree. botocore's parser (shapes,
event hooks, one decode per key) cost 0.04–0.05 s of CPU per 1,000 keys; this about 0.01 s
(docs/performance.md), which a prefix of a million objects takes a thousand times.

A page is returned as botocore returns it, with the fields the movers read: ``Contents``
(``Key``, ``Size``, ``LastModified``, ``ETag``), absent when empty, and
``NextContinuationToken``. Keys are asked URL-encoded (``encoding-type=url``: XML cannot
carry every byte a key may hold) and decoded as botocore decodes them. Used where
``direct`` is.
"""

from __future__ import annotations

import urllib.parse
import xml.etree.ElementTree as ET
from typing import Any

from bbstage.movers import counts
from bbstage.movers.implementations.s3.direct import answered
from bbstage.movers.implementations.s3.fast import FastS3
from bbstage.movers.implementations.s3.timestamps import parse_timestamp


class DirectList:
    """ListObjectsV2, one page at a time (see the module's docstring)."""

    def __init__(self, fast: FastS3) -> None:
        self._fast = fast

    async def page(
        self, bucket: str, prefix: str, token: str | None = None, limit: int = 0
    ) -> dict[str, Any]:
        """The page of keys under ``prefix`` from ``token`` on (``limit``: at most so many)."""
        query = {"encoding-type": "url", "list-type": "2", "prefix": prefix}
        if token:
            query["continuation-token"] = token
        if limit:
            query["max-keys"] = str(limit)
        base = self._fast.endpoint.rstrip("/")
        # Percent-encoded as SigV4 encodes it (never "+" for a space: RGW signs "%20").
        encoded = urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        url = f"{base}/{urllib.parse.quote(bucket)}?{encoded}"
        _, body = await answered(self._fast, url, f"s3://{bucket}/{prefix}", "ListObjectsV2")
        return parse(body)


def parse(body: bytes) -> dict[str, Any]:
    """A ListObjectsV2 answer as botocore's ``list_objects_v2`` returns it (those fields)."""
    root = ET.fromstring(body)
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    encoded = root.findtext(f"{ns}EncodingType") == "url"
    key_tag, size_tag, etag_tag = f"{ns}Key", f"{ns}Size", f"{ns}ETag"
    time_tag = f"{ns}LastModified"
    contents = []
    for item in root.iterfind(f"{ns}Contents"):
        key = item.findtext(key_tag) or ""
        modified = item.findtext(time_tag)
        contents.append(
            {
                "Key": urllib.parse.unquote_plus(key) if encoded else key,
                "Size": counts.size(item.findtext(size_tag) or "0", f"listed key {key[:200]!r}"),
                "LastModified": parse_timestamp(modified) if modified else None,
                "ETag": item.findtext(etag_tag),
            }
        )
    page: dict[str, Any] = {"Contents": contents} if contents else {}
    token = root.findtext(f"{ns}NextContinuationToken")
    if token:
        page["NextContinuationToken"] = token
    return page
