"""HEAD of one object without botocore: signed and sent as ``direct``'s GETs are, in a
thread (``direct.answered``). botocore's first request on a new client cost about 40 ms
of CPU (endpoint rules, event hooks, parser), as much as a whole 64 KiB stage-in; this
about 1 ms (docs/performance.md). Used where ``direct`` is.

The answer is read as botocore's ``head_object`` returns it, with the fields the movers
read: ``ContentLength``, ``LastModified``, ``ETag`` and ``Metadata`` (the ``x-amz-meta-*``
headers, names in lower case). An error answer has no body: it becomes botocore's
``ClientError`` with the status as its code, as botocore words a failed HEAD.
"""

from __future__ import annotations

from typing import Any

from bbstage.movers import counts
from bbstage.movers.implementations.s3.direct import answered, object_url
from bbstage.movers.implementations.s3.fast import FastS3
from bbstage.movers.implementations.s3.timestamps import parse_timestamp

_META = "x-amz-meta-"


class DirectHead:
    """HeadObject (see the module's docstring)."""

    def __init__(self, fast: FastS3) -> None:
        self._fast = fast

    async def head(self, bucket: str, key: str) -> dict[str, Any]:
        """What the object's HEAD answers (the fields above)."""
        url = object_url(self._fast, bucket, key)
        resp, _ = await answered(self._fast, url, f"s3://{bucket}/{key}", "HeadObject", "HEAD")
        modified = resp.getheader("Last-Modified")
        return {
            "ContentLength": counts.size(
                resp.getheader("Content-Length") or "0", f"s3://{bucket}/{key}"
            ),
            "LastModified": parse_timestamp(modified) if modified else None,
            "ETag": resp.getheader("ETag"),
            "Metadata": {
                name.lower()[len(_META) :]: value
                for name, value in resp.getheaders()
                if name.lower().startswith(_META)
            },
        }
