"""benchmarks/s3_ceiling.py: the store's ceiling reads every byte of the object, once."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from s3_ceiling import read_ranges  # noqa: E402  (benchmarks/ is not a package)


@pytest.fixture
def url(client: Any) -> tuple[str, int]:
    """A presigned GET of a 1 MiB + 3 byte object (ranges do not divide it evenly)."""
    bucket = f"bkt-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    size = (1 << 20) + 3
    client.put_object(Bucket=bucket, Key="big", Body=os.urandom(size))
    params = {"Bucket": bucket, "Key": "big"}
    return client.generate_presigned_url("get_object", Params=params), size


@pytest.mark.parametrize("ranges", [1, 4, 7])
def test_every_byte_is_read_once(url: tuple[str, int], ranges: int) -> None:
    presigned, size = url
    assert read_ranges(presigned, size, ranges) == size


def test_a_size_the_object_does_not_have_is_an_error(url: tuple[str, int]) -> None:
    presigned, size = url
    with pytest.raises(ConnectionError, match="not the range asked for"):
        read_ranges(presigned, size + 10, 2)  # the last range is answered short


def test_an_answer_that_is_not_the_range_is_an_error(url: tuple[str, int]) -> None:
    presigned, size = url
    with pytest.raises(ConnectionError, match="not a partial answer.*404"):
        read_ranges(presigned.replace("/big?", "/gone?"), size, 2)
