"""The real S3 endpoint of scripts/local-s3 (Ceph RGW on 127.0.0.1) as a pytest fixture.

Use it from a test module (the import registers the fixture there)::

    from tests.s3env import s3  # noqa: F401

    def test_something(s3):
        bucket = s3.create_bucket(owner="bbuser1")
        client = s3.client("bbuser1")
        client.put_object(Bucket=bucket, Key="k", Body=b"v")

``scripts/local-s3 up`` runs once per session (it is idempotent and takes
< 1 s when RGW runs; a first start takes ~25 s). Buckets made with
``create_bucket`` are emptied and deleted at the end of the session, and those
an earlier session left (it was killed) at the start of the next.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

REPO = Path(__file__).resolve().parents[1]
LOCAL_S3 = REPO / "scripts" / "local-s3"
USERS = ("bbuser1", "bbuser2")
REGION = "us-east-1"
PREFIX = "test-"  # of every bucket create_bucket names
STALE = datetime.timedelta(hours=2)  # no session runs this long (CI: 30 min)


@dataclass(frozen=True)
class S3Keys:
    """An S3 access key pair."""

    key: str
    secret: str


def parse_exports(text: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of ``export NAME=value`` lines (values shell-quoted, ``"$PATH"`` kept)."""
    env = dict(base if base is not None else os.environ)
    for line in text.splitlines():
        m = re.match(r"export (\w+)=(.*)", line)
        if m:
            value = m.group(2).replace('"$PATH"', env.get("PATH", ""))
            env[m.group(1)] = shlex.split(value)[0] if value else ""
    return env


@dataclass
class S3Env:
    """The running RGW: endpoint, the admin keys, each test user's keys, helpers."""

    endpoint: str
    admin: S3Keys
    users: dict[str, S3Keys]
    dir: Path
    env: dict[str, str]
    _buckets: list[tuple[str, str | None]] = field(default_factory=list, repr=False)

    def keys(self, user: str | S3Keys | None = None) -> S3Keys:
        """The keys of a test user (``bbuser1``, ``bbuser2``); None: the admin user's."""
        if isinstance(user, S3Keys):
            return user
        return self.admin if user is None else self.users[user]

    def client(
        self,
        user: str | S3Keys | None = None,
        *,
        endpoint: str | None = None,
        retries: int | None = None,
        **config: Any,
    ) -> Any:
        """A botocore S3 client with ``user``'s keys (None: admin; or S3Keys) for ``endpoint``.

        ``retries``: total attempts (standard retry mode); other keyword arguments
        go to ``botocore.config.Config``.
        """
        keys = self.keys(user)
        if retries is not None:
            config["retries"] = {"total_max_attempts": retries, "mode": "standard"}
        config.setdefault("connect_timeout", 10)
        config.setdefault("read_timeout", 60)
        session = botocore.session.Session()
        return session.create_client(
            "s3",
            region_name=REGION,
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=keys.key,
            aws_secret_access_key=keys.secret,
            config=Config(**config),
        )

    def storage_options(self, user: str | None = None) -> dict[str, Any]:
        """Keyword arguments for ``s3fs.S3FileSystem`` with ``user``'s keys."""
        keys = self.keys(user)
        return {
            "key": keys.key,
            "secret": keys.secret,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": REGION},
        }

    def create_bucket(self, owner: str | None = None, name: str | None = None) -> str:
        """Create a bucket owned by ``owner`` (None: admin); deleted at session end."""
        name = name or f"{PREFIX}{uuid.uuid4().hex[:12]}"
        self.client(owner).create_bucket(Bucket=name)
        self._buckets.append((name, owner))
        return name

    def empty_bucket(self, name: str, owner: str | None = None) -> None:
        """Delete every object and unfinished multipart upload of a bucket."""
        client = self.client(owner)
        for page in client.get_paginator("list_object_versions").paginate(Bucket=name):
            objects = [
                {"Key": o["Key"], "VersionId": o["VersionId"]}
                for o in page.get("Versions", []) + page.get("DeleteMarkers", [])
            ]
            # A key XML cannot carry (a control character) cannot be in DeleteObjects' body.
            odd = [o for o in objects if any(ord(c) < 32 for c in o["Key"])]
            for o in odd:
                client.delete_object(Bucket=name, **o)
            objects = [o for o in objects if o not in odd]
            if objects:
                client.delete_objects(Bucket=name, Delete={"Objects": objects, "Quiet": True})
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=name):
            for up in page.get("Uploads", []):
                client.abort_multipart_upload(Bucket=name, Key=up["Key"], UploadId=up["UploadId"])

    def delete_bucket(self, name: str, owner: str | None = None) -> None:
        """Empty and delete a bucket."""
        self.empty_bucket(name, owner)
        self.client(owner).delete_bucket(Bucket=name)

    def cleanup(self) -> None:
        """Delete the buckets made with ``create_bucket`` (those still there)."""
        while self._buckets:
            name, owner = self._buckets.pop()
            try:
                self.delete_bucket(name, owner)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NoSuchBucket":
                    raise

    def sweep(self, older_than: datetime.timedelta = STALE, prefix: str = PREFIX) -> list[str]:
        """Delete the test buckets an earlier, killed session left (made ``older_than`` ago).

        A session deletes its buckets at its end; one that is killed cannot, and the
        store (a 16 GiB block file) fills up over days of runs. Returns their names.
        """
        swept = []
        now = datetime.datetime.now(datetime.UTC)
        for owner in (None, *self.users):
            for bucket in self.client(owner).list_buckets().get("Buckets", []):
                if bucket["Name"].startswith(prefix) and now - bucket["CreationDate"] > older_than:
                    self.delete_bucket(bucket["Name"], owner)
                    swept.append(bucket["Name"])
        return swept

    def up(self) -> None:
        """Run ``scripts/local-s3 up`` again (e.g. after a test stopped a daemon)."""
        subprocess.run([str(LOCAL_S3), "up"], check=True, stdout=subprocess.DEVNULL, timeout=600)


def start() -> S3Env:
    """Run ``scripts/local-s3 up`` and describe what it started."""
    proc = subprocess.run([str(LOCAL_S3), "up"], stdout=subprocess.PIPE, text=True, timeout=1200)
    assert proc.returncode == 0, "scripts/local-s3 up failed (see its output above)"
    env = parse_exports(proc.stdout)
    return S3Env(
        endpoint=env["AWS_ENDPOINT_URL"],
        admin=S3Keys(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]),
        users={
            user: S3Keys(
                env[f"BBSTAGE_S3_{user.upper()}_KEY"], env[f"BBSTAGE_S3_{user.upper()}_SECRET"]
            )
            for user in USERS
        },
        dir=Path(env["BBSTAGE_S3_DIR"]),
        env=env,
    )


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Env]:
    """RGW from scripts/local-s3, started once per session."""
    env = start()
    env.sweep()
    yield env
    env.cleanup()
