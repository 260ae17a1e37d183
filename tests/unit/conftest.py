"""Fixtures shared by the unit tests: a directory every user may write, and an S3 endpoint
(moto's server on 127.0.0.1, one per test module)."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer


@pytest.fixture
def area() -> Iterator[Path]:
    """A directory every user may write (tmp_path is root's alone): workers run as others."""
    path = Path(tempfile.mkdtemp(prefix="bbstage-unit-", dir="/var/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def bucket(client: Any) -> str:
    name = f"bkt-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=name)
    return name
