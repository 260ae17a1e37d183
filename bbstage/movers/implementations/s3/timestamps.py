"""Timestamps of S3 answers, parsed fast (botocore's parser, dateutil, is slow)."""

from __future__ import annotations

import datetime
from typing import Any


def parse_timestamp(value: Any) -> Any:
    """botocore's timestamps, parsed fast: ISO 8601 (every LastModified of a LIST) with
    ``datetime.fromisoformat``, in 0.3 µs where botocore's dateutil takes 60 µs (a
    third of the client's CPU listing 1,000 objects); anything else (HTTP dates of HEAD, epoch
    seconds, no zone) with botocore's own parser."""
    if isinstance(value, str):
        try:
            parsed = datetime.datetime.fromisoformat(value)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed
    from botocore.utils import parse_timestamp as botocore_parse

    return botocore_parse(value)
