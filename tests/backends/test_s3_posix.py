"""The fast paths adopt the shared suite (``abstract.BackendSuite``): S3 against Ceph RGW of
scripts/local-s3 (shared: it is used, never restarted), and POSIX between two directories."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bbstage.movers.implementations.posix import PosixBackend
from bbstage.movers.implementations.s3 import S3Backend, S3Options
from tests.backends.abstract import BackendSuite
from tests.backends.stores import Store, fresh
from tests.s3env import S3Env, s3

__all__ = ["s3"]  # the session fixture, registered here


class TestS3(BackendSuite):
    @pytest.fixture
    def store(self, s3: S3Env) -> Iterator[Store]:
        bucket = s3.create_bucket(owner="bbuser1")
        keys = s3.keys("bbuser1")
        options = S3Options(
            s3={"endpoint_url": s3.endpoint, "part_size": "5M", "multipart_threshold": "8M"},
            credentials={"key": keys.key, "secret": keys.secret},
        )
        root = f"s3://{bucket}/{fresh()}"
        yield Store("s3", root, options, S3Backend.filesystem(options, root))


class TestPosix(BackendSuite):
    @pytest.fixture
    def store(self) -> Iterator[Store]:
        with tempfile.TemporaryDirectory(prefix="bbstage-suite-") as top:
            root = Path(top)
            yield Store(
                "posix", f"{root}/", None, PosixBackend.filesystem(None, ""), local_root=root
            )
