"""HEAD of one object without botocore: signed and sent as ``direct``'s GETs are, in a
thread. botocore's first request on a new client cost about 40 ms of CPU (endpoint rules,
event hooks, parser), as much as a whole 64 KiB stage-in; this about 1 ms
(docs/performance.md). Used where ``direct`` is.

The answer is read as botocore's ``head_object`` returns it, with the fields the movers
read: ``ContentLength``, ``LastModified``, ``ETag`` and ``Metadata`` (the ``x-amz-meta-*``
headers, names in lower case). An error answer has no body: it becomes botocore's
``ClientError`` with the status as its code, as botocore words a failed HEAD.
"""

from __future__ import annotations

import asyncio
import http.client
from typing import Any

from bbstage.movers.implementations.s3.direct import (
    client_error,
    connection,
    connection_failed,
    object_url,
    send,
    signed,
)
from bbstage.movers.implementations.s3.fast import FastS3
from bbstage.movers.implementations.s3.timestamps import parse_timestamp

_META = "x-amz-meta-"


class DirectHead:
    """HeadObject (see the module's docstring)."""

    def __init__(self, fast: FastS3) -> None:
        self._fast = fast

    async def head(self, bucket: str, key: str) -> dict[str, Any]:
        """What the object's HEAD answers (the fields above)."""
        creds = await self._fast.credentials()
        url = object_url(self._fast, bucket, key)
        target, headers = signed(self._fast, url, {}, creds, method="HEAD")
        return await asyncio.to_thread(self._head, f"s3://{bucket}/{key}", target, headers)

    def _head(self, url: str, target: str, headers: dict[str, str]) -> dict[str, Any]:
        conn = connection(self._fast)
        try:
            resp = send(self._fast, conn, target, headers, method="HEAD")
            resp.read()  # nothing: a HEAD's answer has no body
        except (OSError, http.client.HTTPException) as exc:
            raise connection_failed(self._fast, exc, url) from None
        finally:
            conn.close()
        if resp.status != 200:
            raise client_error(resp.status, b"", "HeadObject")
        modified = resp.getheader("Last-Modified")
        return {
            "ContentLength": int(resp.getheader("Content-Length") or 0),
            "LastModified": parse_timestamp(modified) if modified else None,
            "ETag": resp.getheader("ETag"),
            "Metadata": {
                name.lower()[len(_META) :]: value
                for name, value in resp.getheaders()
                if name.lower().startswith(_META)
            },
        }
