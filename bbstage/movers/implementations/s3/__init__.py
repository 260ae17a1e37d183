"""S3 to POSIX (``S3Download``) and POSIX to S3 (``S3Upload``), through s3fs and aiobotocore.

s3fs builds the client (credentials from the user's own ``~/.aws`` files or from what the
administrator mapped to the user, endpoint/region/addressing from ``[s3]``); the data path is
our own asyncio code on that client, because batching and concurrency are where the speed is:

* many objects at once: ``copy_many`` keeps ``files_in_flight`` objects moving in one event loop,
  the whole small ones they hold within a byte budget (``budget``);
* without ``checksum=``, small objects' GETs and single PUTs (up to ``fast.FAST_MAX``) go
  through obstore (Rust), a third of botocore's client CPU per request, same client
  settings and the credentials botocore resolved (``fast``), one request each; big GETs
  are read straight into the file in a thread (``direct``: http.client, signed by botocore),
  and so are LIST pages, parsed with ElementTree (``listing``), and HEADs (``head``);
* big uploads: multipart, ``part_size`` parts, at most ``max_concurrency`` parts in flight per
  transfer (which also bounds memory), aborted on any failure or cancel;
* big downloads: ``download_concurrency`` ranges of equal size at once, each one long GET
  written with ``pwrite`` (resumed with a ranged GET from the byte it reached after a
  dropped connection), or one streamed GET (``download_concurrency = 1``).

Downloads write a temporary file beside the destination and rename it into place when the
size is right (``localfs.atomic_file``). Errors name the ``s3://`` URL; throttling, 5xx and
dropped connections are transient (retried by the worker), the rest are permanent.

Modules, by concern: ``settings`` (``[s3]`` and mapped credentials: what the daemon reads),
``errors`` (URLs, error translation), ``common`` (the mover base both directions share),
``download`` (``S3Download``), ``upload`` (``S3ObjectUpload``), ``pieces`` (``S3Upload``: and
one file's shares across nodes), ``fast`` (small objects via obstore), ``direct`` (big GETs),
``listing`` (LIST pages), ``head`` (HEADs), ``budget`` (bytes held at once), ``timestamps``
(S3 times, parsed fast).
"""

from bbstage.movers.implementations.s3.common import MTIME_KEY, checksum_key
from bbstage.movers.implementations.s3.download import S3Download
from bbstage.movers.implementations.s3.errors import S3Error, split_url, translate
from bbstage.movers.implementations.s3.pieces import S3Upload
from bbstage.movers.implementations.s3.settings import (
    S3Settings,
    mapped_credentials,
    parse_mode,
    spec_extra,
)

__all__ = [
    "MTIME_KEY",
    "S3Download",
    "S3Error",
    "S3Settings",
    "S3Upload",
    "checksum_key",
    "mapped_credentials",
    "parse_mode",
    "spec_extra",
    "split_url",
    "translate",
]
