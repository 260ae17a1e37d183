"""scripts/local-s3: RGW on 127.0.0.1, its users, the test users' ~/.aws files, idempotent up."""

from __future__ import annotations

import datetime as dt
import json
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tests.s3env import LOCAL_S3, REPO, S3Env, S3Keys, parse_exports, s3  # noqa: F401

VENV_PYTHON = REPO / ".venv" / "bin" / "python"


def run_as(user: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Python as ``user`` with a clean environment (HOME only, no AWS_*), as the
    daemon's worker does."""
    home = pwd.getpwnam(user).pw_dir
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin"]
        + [str(VENV_PYTHON), "-c", code, *args],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_up_prints_exports_and_is_idempotent(s3: S3Env) -> None:  # noqa: F811
    out = subprocess.run(
        [str(LOCAL_S3), "up"], check=True, capture_output=True, text=True, timeout=600
    ).stdout
    lines = out.splitlines()
    assert lines and all(line.startswith("export ") for line in lines), out
    env = parse_exports(out, base={})
    assert env["AWS_ENDPOINT_URL"] == s3.endpoint
    assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert env["AWS_ACCESS_KEY_ID"] == s3.admin.key
    assert env["BBSTAGE_S3_BBUSER1_KEY"] == s3.users["bbuser1"].key
    assert env["BBSTAGE_S3_BBUSER2_SECRET"] == s3.users["bbuser2"].secret
    assert len({s3.admin.key, s3.users["bbuser1"].key, s3.users["bbuser2"].key}) == 3
    status = subprocess.run([str(LOCAL_S3), "status"], capture_output=True, text=True)
    assert status.returncode == 0, status.stdout
    assert "radosgw: running" in status.stdout


@pytest.mark.parametrize("user", ["bbuser1", "bbuser2"])
def test_user_aws_files(s3: S3Env, user: str) -> None:  # noqa: F811
    """~user/.aws/{credentials,config}: the user's own keys and the endpoint, 0600, theirs;
    botocore and s3fs, run as the user with no AWS_* variables, find both."""
    home = Path(pwd.getpwnam(user).pw_dir)
    for name in ("credentials", "config"):
        st = (home / ".aws" / name).stat()
        assert st.st_mode & 0o777 == 0o600
        assert pwd.getpwuid(st.st_uid).pw_name == user
    bucket = f"own-{user}-{os.urandom(4).hex()}"
    code = """
import json, sys, botocore.session, s3fs
client = botocore.session.get_session().create_client("s3")
client.create_bucket(Bucket=sys.argv[1])
fs = s3fs.S3FileSystem()
fs.pipe(sys.argv[1] + "/k", b"mine")
creds = client._request_signer._credentials
print(json.dumps({"endpoint": client.meta.endpoint_url, "key": creds.access_key,
                  "data": fs.cat(sys.argv[1] + "/k").decode()}))
"""
    proc = run_as(user, code, bucket)
    assert proc.returncode == 0, proc.stderr
    s3._buckets.append((bucket, user))
    seen = json.loads(proc.stdout)
    assert seen == {"endpoint": s3.endpoint, "key": s3.users[user].key, "data": "mine"}


def test_other_users_credentials_are_refused(s3: S3Env) -> None:  # noqa: F811
    bucket = s3.create_bucket(owner="bbuser1")
    s3.client("bbuser1").put_object(Bucket=bucket, Key="secret", Body=b"x")
    other = s3.client("bbuser2")
    for call in (
        lambda: other.get_object(Bucket=bucket, Key="secret"),
        lambda: other.put_object(Bucket=bucket, Key="new", Body=b"y"),
        lambda: other.list_objects_v2(Bucket=bucket),
    ):
        with pytest.raises(ClientError) as err:
            call()
        assert err.value.response["Error"]["Code"] == "AccessDenied"
    wrong = S3Keys(s3.users["bbuser1"].key, "not-the-secret")
    with pytest.raises(ClientError) as err:
        s3.client(wrong).get_object(Bucket=bucket, Key="secret")
    assert err.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_up_restarts_a_killed_radosgw(s3: S3Env) -> None:  # noqa: F811
    pidfile = s3.dir / "run" / "rgw.pid"
    pid = int(pidfile.read_text())
    os.kill(pid, signal.SIGKILL)
    s3.up()
    assert int(pidfile.read_text()) != pid
    bucket = s3.create_bucket()
    s3.client().put_object(Bucket=bucket, Key="after", Body=b"ok")
    assert s3.client().get_object(Bucket=bucket, Key="after")["Body"].read() == b"ok"


def test_sweep_deletes_old_test_buckets_of_every_user_and_keeps_new_ones(
    s3: S3Env,  # noqa: F811
) -> None:
    prefix = f"sweep-{os.getpid()}-"
    mine = s3.create_bucket(owner="bbuser2", name=f"{prefix}a")
    s3.client("bbuser2").put_object(Bucket=mine, Key="k", Body=b"v")
    admins = s3.create_bucket(name=f"{prefix}b")
    assert s3.sweep(prefix=prefix) == []  # made just now: maybe a running session's
    assert sorted(s3.sweep(older_than=dt.timedelta(0), prefix=prefix)) == [mine, admins]
    names = [b["Name"] for b in s3.client("bbuser2").list_buckets()["Buckets"]]
    assert mine not in names


def _ceph(s3: S3Env, *args: str) -> str:  # noqa: F811
    cmd = ["ceph", "-c", str(s3.dir / "ceph.conf"), *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout


def test_up_refuses_to_start_radosgw_on_a_full_osd_and_says_what_to_do(
    s3: S3Env,  # noqa: F811
) -> None:
    """radosgw on a full OSD hangs in its start-up writes: up says why instead of timing out."""
    ratios = {"nearfull": "0.85", "backfillfull": "0.9", "full": "0.95"}
    try:
        for name, ratio in (("nearfull", "0.0005"), ("backfillfull", "0.0008"), ("full", "0.001")):
            _ceph(s3, "osd", f"set-{name}-ratio", ratio)
        for _ in range(60):
            if "full osd" in _ceph(s3, "health"):
                break
            time.sleep(1)
        os.kill(int((s3.dir / "run" / "rgw.pid").read_text()), signal.SIGKILL)
        proc = subprocess.run([str(LOCAL_S3), "up"], capture_output=True, text=True, timeout=110)
        assert proc.returncode != 0
        assert "cannot start on a full OSD" in proc.stderr
        assert "local-s3 down --purge" in proc.stderr
    finally:
        for name, ratio in ratios.items():
            _ceph(s3, "osd", f"set-{name}-ratio", ratio)
        for _ in range(60):
            if "full" not in _ceph(s3, "health"):
                break
            time.sleep(1)
        s3.up()
