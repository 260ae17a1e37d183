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

from typing import Any, ClassVar

from bbstage.movers.backends import Backend, UrlRule
from bbstage.movers.base import BackendOptions, MoverOptions
from bbstage.movers.implementations.s3.common import MTIME_KEY, checksum_key
from bbstage.movers.implementations.s3.download import S3Download
from bbstage.movers.implementations.s3.errors import S3Error, split_url, translate
from bbstage.movers.implementations.s3.pieces import S3Upload
from bbstage.movers.implementations.s3.settings import (
    S3Options,
    S3Settings,
    allow_endpoint,
    mapped_credentials,
    parse_mode,
    s3_options,
    user_client,
)

_HERE = "bbstage.movers.implementations.s3"


class S3Backend(Backend):
    """``s3://bucket/key``: the registry's entry for S3 (its fast paths both ways)."""

    name = "s3"
    schemes = ("s3",)
    url_rule = UrlRule(
        what="S3 bucket",
        rules="bucket names have 3-63 characters a-z 0-9 . - and start and end with a letter"
        " or digit",
        chars=("a-z", "0-9", ".", "-"),
        ends=("a-z", "0-9"),
        low=3,
        high=63,
    )
    section = "s3"
    settings_type = S3Settings
    directive_keys = frozenset({"profile"})
    # Read by botocore and aiohttp; never AWS_* (root's keys, container-role URIs): the
    # user's own ~/.aws files and [s3.accounts] are the only credentials.
    env = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy")
    preload = (
        _HERE,  # once, not per worker (docs/performance.md)
        "s3fs",  # the S3 movers import these at their first client, ~0.3 s
        "aiobotocore.session",
        "obstore",  # 15 MB of Rust: else read at each worker's first small object
        f"{_HERE}.preload",  # botocore's S3 model, parsed
    )
    movers: ClassVar[dict[tuple[str, str], str]] = {
        ("s3", "posix"): f"{_HERE}:S3Download",
        ("posix", "s3"): f"{_HERE}:S3Upload",
    }
    assembles_pieces = True

    @classmethod
    def options(cls, settings: Any, uid: int, directive: dict[str, str]) -> BackendOptions | None:
        return s3_options(settings, uid, directive.get("profile"))

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        """s3fs on the user's credentials and the site's ``[s3]``, as the fast paths build it
        (the endpoint checked against ``allowed_endpoints`` before any request): the
        generic mover's S3 side (store to store)."""
        mine = options if isinstance(options, S3Options) else S3Options()
        mover = S3Download(MoverOptions(source=mine))
        mover._run(mover._s3)
        return mover._filesystem()

    @classmethod
    def strip(cls, url: str) -> str:
        return url.removeprefix("s3://")


__all__ = [
    "MTIME_KEY",
    "S3Backend",
    "S3Download",
    "S3Error",
    "S3Options",
    "S3Settings",
    "S3Upload",
    "allow_endpoint",
    "checksum_key",
    "mapped_credentials",
    "parse_mode",
    "s3_options",
    "split_url",
    "translate",
    "user_client",
]
