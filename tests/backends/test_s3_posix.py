"""The fast paths adopt the shared suite (``abstract.BackendSuite``): S3 against Ceph RGW of
scripts/local-s3 (shared: it is used, never restarted), and POSIX between two directories."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bbstage.movers.implementations.fsstore import StoreOptions
from bbstage.movers.implementations.posix import PosixBackend
from bbstage.movers.implementations.s3 import S3Backend, S3Options
from bbstage.transfer import Done, TransferSpec, worker
from tests.backends.abstract import BackendSuite
from tests.backends.stores import Store, fresh, open_store, stores_env, user_home
from tests.helpers import Conn
from tests.s3env import S3Env, s3

__all__ = ["s3", "stores_env"]  # the session fixtures, registered here


def s3_store(s3: S3Env) -> Store:
    """A fresh place in a new bucket of bbuser1's on RGW, 5 MiB parts above 8 MiB."""
    bucket = s3.create_bucket(owner="bbuser1")
    keys = s3.keys("bbuser1")
    options = S3Options(
        s3={"endpoint_url": s3.endpoint, "part_size": "5M", "multipart_threshold": "8M"},
        credentials={"key": keys.key, "secret": keys.secret},
    )
    root = f"s3://{bucket}/{fresh()}"
    return Store("s3", root, options, S3Backend.filesystem(options, root))


class TestS3(BackendSuite):
    @pytest.fixture
    def store(self, s3: S3Env) -> Iterator[Store]:
        yield s3_store(s3)


class TestPosix(BackendSuite):
    @pytest.fixture
    def store(self) -> Iterator[Store]:
        with tempfile.TemporaryDirectory(prefix="bbstage-suite-") as top:
            root = Path(top)
            yield Store(
                "posix", f"{root}/", None, PosixBackend.filesystem(None, ""), local_root=root
            )


def test_between_s3_and_another_store_through_the_generic_mover(
    s3: S3Env, stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On-premises S3 (RGW) to a cloud store and back (Azure, Azurite): no fast path serves
    the pair, so the generic mover streams it through the worker. A file over a whole
    read's 4 MiB and over S3's multipart threshold, bytes compared both ways."""
    user_home(tmp_path, monkeypatch)
    on_site = s3_store(s3)
    gen = open_store("az", stores_env, StoreOptions({}))
    cloud = next(gen)
    try:
        body = os.urandom((11 << 20) + 7)
        on_site.put("big", body)
        for a, name, b in ((on_site, "big", cloud), (cloud, "from-s3", on_site)):
            spec = TransferSpec.between(
                a.url(name), b.url(f"from-{a.kind}"), job_id="s2s",
                source_options=a.options, destination_options=b.options,
            )  # fmt: skip
            conn = Conn()
            worker.transfer(spec, worker.Reporter(conn), threading.Event())  # type: ignore[arg-type]
            assert isinstance(conn.events[-1], Done), conn.events[-1]
            assert b.get(f"from-{a.kind}") == body
    finally:
        next(gen, None)
