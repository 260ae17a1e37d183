"""The S3 movers against moto's server on 127.0.0.1: files, trees, globs, multipart, resume,
errors, cancel, credentials (moto accepts any key: real auth is tested against RGW in
tests/integration/test_s3.py)."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.exceptions import ClientError

from bbstage.movers import FileTask, MoverOptions, TransferError
from bbstage.movers.base import safe_rel
from bbstage.movers.implementations import s3 as s3m
from bbstage.movers.implementations.s3.settings import S3Options
from bbstage.transfer import Done, Failed, FileRange, Planned, TransferSpec, worker
from tests.helpers import Conn, file_digest, run_worker, s3_sides

CREDS = {"key": "testing", "secret": "testing"}


def extra(endpoint: str, **s3: Any) -> dict[str, Any]:
    return {"s3": {"endpoint_url": endpoint, **s3}, "credentials": CREDS}


def run(
    src: str, dst: str, endpoint: str, *, glob: bool = False, ex: dict | None = None, **s3: Any
) -> Conn:
    spec = TransferSpec.between(
        src, dst, job_id="7", glob=glob, **s3_sides(ex if ex is not None else extra(endpoint, **s3))
    )
    return run_worker(spec)


def plan_event(conn: Conn) -> tuple[Any, ...]:
    return next(e for e in conn.events if isinstance(e, Planned))


def test_file_up_and_down(tmp_path: Path, endpoint: str, client: Any, bucket: str) -> None:
    src = tmp_path / "in.dat"
    src.write_bytes(os.urandom(100_000))
    run(str(src), f"s3://{bucket}/run/in.dat", endpoint)
    assert client.head_object(Bucket=bucket, Key="run/in.dat")["ContentLength"] == 100_000
    dst = tmp_path / "out" / "copy.dat"
    conn = run(f"s3://{bucket}/run/in.dat", str(dst), endpoint)
    assert plan_event(conn) == Planned(100_000, 1)
    assert dst.read_bytes() == src.read_bytes()
    assert oct(dst.stat().st_mode & 0o777) == oct(0o644)
    modified = client.head_object(Bucket=bucket, Key="run/in.dat")["LastModified"]
    assert abs(dst.stat().st_mtime - modified.timestamp()) < 1
    assert [p.name for p in dst.parent.iterdir()] == ["copy.dat"]  # no temporary left
    # Staged again: nothing to do, in either direction.
    assert plan_event(run(f"s3://{bucket}/run/in.dat", str(dst), endpoint)) == Planned(0, 0)
    assert plan_event(run(str(src), f"s3://{bucket}/run/in.dat", endpoint)) == Planned(0, 0)


def test_tree_of_many_small_objects(tmp_path: Path, endpoint: str, bucket: str) -> None:
    src = tmp_path / "src"
    for i in range(120):
        sub = src / f"d{i % 3}" / ("deep" if i % 2 else "")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i}.txt").write_bytes(os.urandom(i))
    conn = run(f"{src}/", f"s3://{bucket}/tree/", endpoint, files_in_flight=8)
    assert plan_event(conn).files == 120
    dst = tmp_path / "dst"
    conn = run(f"s3://{bucket}/tree/", f"{dst}/", endpoint)
    assert plan_event(conn) == Planned(sum(range(120)), 120)
    got = sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file())
    want = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    assert got == want
    assert all(file_digest(dst / r) == file_digest(src / r) for r in want[:50])
    assert oct((dst / "d1" / "deep").stat().st_mode & 0o777) == oct(0o755)
    # Re-running skips everything (one LIST for the upload side, not a HEAD per object).
    assert plan_event(run(f"{src}/", f"s3://{bucket}/tree/", endpoint)) == Planned(0, 0)
    assert plan_event(run(f"s3://{bucket}/tree/", f"{dst}/", endpoint)) == Planned(0, 0)


@pytest.mark.parametrize("download_concurrency", [1, 4])
def test_big_object_multipart(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, download_concurrency: int
) -> None:
    src = tmp_path / "big"
    src.write_bytes(os.urandom(40 << 20))
    small = {"part_size": "5M", "multipart_threshold": "8M", "max_concurrency": 4}
    run(str(src), f"s3://{bucket}/big", endpoint, **small)
    etag = client.head_object(Bucket=bucket, Key="big")["ETag"]
    assert etag.strip('"').endswith("-8")  # 8 parts of 5 MiB
    dst = tmp_path / "copy"
    run(
        f"s3://{bucket}/big", str(dst), endpoint, download_concurrency=download_concurrency, **small
    )
    assert file_digest(dst) == file_digest(src)


def test_glob_and_whole_bucket(tmp_path: Path, endpoint: str, client: Any, bucket: str) -> None:
    for key in ["logs/a.gz", "logs/b.gz", "logs/c.txt", "logs/sub/d.gz", "top.gz"]:
        client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    out = tmp_path / "g"
    run(f"s3://{bucket}/logs/*.gz", str(out), endpoint, glob=True)
    assert sorted(p.name for p in out.iterdir()) == ["a.gz", "b.gz"]
    whole = tmp_path / "w"
    run(f"s3://{bucket}/", f"{whole}/", endpoint)
    assert (whole / "logs" / "sub" / "d.gz").read_bytes() == b"logs/sub/d.gz"
    assert (whole / "top.gz").exists()


def test_missing_key_bucket_and_prefix(tmp_path: Path, endpoint: str, bucket: str) -> None:
    with pytest.raises(TransferError, match=rf"no such object: s3://{bucket}/nope") as e:
        run(f"s3://{bucket}/nope", str(tmp_path / "x"), endpoint)
    assert e.value.permanent
    with pytest.raises(TransferError, match="no such bucket: s3://no-such-bkt-x1/") as e:
        run("s3://no-such-bkt-x1/k", str(tmp_path / "x"), endpoint)
    assert e.value.permanent
    with pytest.raises(TransferError, match="no such object: nothing under"):
        run(f"s3://{bucket}/empty/", f"{tmp_path}/x/", endpoint)
    (tmp_path / "f").write_text("x")
    run(str(tmp_path / "f"), f"s3://{bucket}/dir/f", endpoint)
    with pytest.raises(TransferError, match="is a prefix"):
        run(f"s3://{bucket}/dir", str(tmp_path / "x"), endpoint)
    with pytest.raises(TransferError, match="no such bucket"):
        run(str(tmp_path / "f"), "s3://no-such-bkt-x1/f", endpoint)


def test_profiles_from_the_users_own_aws_files(
    tmp_path: Path, endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    aws = tmp_path / ".aws"
    aws.mkdir()
    (tmp_path / "f").write_text("data")
    s3 = {"endpoint_url": endpoint, "connect_timeout": 1}
    # No credentials at all (and never the host's instance role).
    with pytest.raises(TransferError, match="no S3 credentials for user .*~/.aws/credentials"):
        run(str(tmp_path / "f"), f"s3://{bucket}/f", endpoint, ex={"s3": s3})
    (aws / "credentials").write_text("[lab]\naws_access_key_id = a\naws_secret_access_key = b\n")
    run(str(tmp_path / "f"), f"s3://{bucket}/f", endpoint, ex={"s3": s3, "profile": "lab"})
    with pytest.raises(TransferError, match="no S3 profile 'other' in ~/.aws/credentials") as e:
        run(str(tmp_path / "f"), f"s3://{bucket}/f", endpoint, ex={"s3": s3, "profile": "other"})
    assert e.value.permanent
    # A profile's endpoint_url in ~/.aws/config wins over the site's [s3] endpoint_url, when
    # the site allows it.
    (aws / "config").write_text(f"[profile lab]\nendpoint_url = {endpoint}\n")
    bad = {"endpoint_url": "http://127.0.0.1:9", "connect_timeout": 1}
    bad["allowed_endpoints"] = [endpoint]
    run(f"s3://{bucket}/f", str(tmp_path / "g"), endpoint, ex={"s3": bad, "profile": "lab"})
    assert (tmp_path / "g").read_text() == "data"


class _Listener:
    """A TCP port on 127.0.0.1 that counts the connections made to it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


def test_a_users_own_endpoint_must_be_one_the_site_allows(
    tmp_path: Path, endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SSRF: a user's endpoint_url (~/.aws/config) that the site did not allow is refused
    before any request, naming it and the key to set; http:// only when listed as such."""
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".aws").mkdir()
    inside = _Listener()  # a host of the management network, say
    (tmp_path / ".aws" / "config").write_text(
        f"[default]\nendpoint_url = http://127.0.0.1:{inside.port}\n"
    )
    src, dst = f"s3://{bucket}/f", str(tmp_path / "g")
    refused = (
        rf"S3 endpoint http://127.0.0.1:{inside.port} \(endpoint_url of \[default\] in"
        r" ~/.aws/config of user \w+\) is not allowed on this site: the administrator may add"
        r" it to \[s3\] allowed_endpoints in the daemon config"
    )
    for allowed in ([], [f"127.0.0.1:{inside.port}"], [f"https://127.0.0.1:{inside.port}"]):
        s3 = {"endpoint_url": endpoint, "connect_timeout": 1, "allowed_endpoints": allowed}
        with pytest.raises(TransferError, match=refused) as e:
            run(src, dst, endpoint, ex={"s3": s3, "credentials": CREDS})
        assert e.value.permanent
    assert inside.connections == 0 and not (tmp_path / "g").exists()
    # Listed with its scheme: the transfer goes there.
    s3 = {"endpoint_url": endpoint, "allowed_endpoints": [f"http://127.0.0.1:{inside.port}"]}
    s3["connect_timeout"] = s3["read_timeout"] = s3["retries"] = 1
    with pytest.raises(TransferError):
        run(src, dst, endpoint, ex={"s3": s3, "credentials": CREDS})
    assert inside.connections > 0
    inside.sock.close()


ROLE_KEYS = {
    "Code": "Success",
    "Type": "AWS-HMAC",
    "AccessKeyId": "HOSTROLEKEY",
    "SecretAccessKey": "host-role-secret",
    "Token": "host-role-token",
    "LastUpdated": "2024-01-01T00:00:00Z",
    "Expiration": "2099-01-01T00:00:00Z",
}


class FakeMetadata(http.server.BaseHTTPRequestHandler):
    """The host's EC2 instance metadata service (IMDSv2) and container credentials endpoint:
    hands a role's keys to whoever asks, and records every request in ``server.asked``."""

    server: Any
    replies = {
        "PUT /latest/api/token": b"imds-token",
        "GET /latest/meta-data/iam/security-credentials/": b"host-role",
        "GET /latest/meta-data/iam/security-credentials/host-role": json.dumps(ROLE_KEYS).encode(),
        "GET /container-creds": json.dumps(ROLE_KEYS).encode(),
    }

    def do_PUT(self) -> None:
        self.reply()

    def do_GET(self) -> None:
        self.reply()

    def reply(self) -> None:
        asked = f"{self.command} {self.path}"
        self.server.asked.append(asked)
        body = self.replies.get(asked)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def host_role() -> Iterator[tuple[str, list[str]]]:
    """A fake metadata server on 127.0.0.1: its URL and the requests it has seen."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeMetadata)
    server.asked = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", server.asked  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("route", ["instance", "container"])
def test_a_user_without_credentials_never_gets_the_hosts_role(
    route: str,
    tmp_path: Path,
    endpoint: str,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    host_role: tuple[str, list[str]],
) -> None:
    """The instance-role and container-role providers are out of the chain, so a fake host
    role on 127.0.0.1 is never asked. ``instance``: the user's own ~/.aws/config points IMDS
    here (on EC2 it needs no setting at all: 169.254.169.254). ``container``: only
    AWS_CONTAINER_CREDENTIALS_FULL_URI reaches it, which the worker never passes on
    (worker-env-allow-list), so this route checks the chain alone, as if root's environment
    had leaked through."""
    url, asked = host_role
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".aws").mkdir()
    if route == "instance":
        config = f"[default]\nec2_metadata_service_endpoint = {url}\n"
        (tmp_path / ".aws" / "config").write_text(config)
    else:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{url}/container-creds")
    (tmp_path / "f").write_text("data")
    s3 = {"endpoint_url": endpoint, "connect_timeout": 1}
    with pytest.raises(TransferError, match="no S3 credentials for user .*~/.aws/credentials"):
        run(str(tmp_path / "f"), f"s3://{bucket}/f", endpoint, ex={"s3": s3})
    assert asked == []
    # The bait is live: botocore's own chain, with the same HOME and environment, takes the role.
    assert botocore.session.get_session().get_credentials().access_key == "HOSTROLEKEY"
    assert any("security-credentials" in a or "container-creds" in a for a in asked)


@pytest.mark.parametrize("route", ["services", "source_profile", "credential_source"])
def test_a_users_profile_never_sends_its_clients_elsewhere_nor_takes_the_hosts_role(
    route: str, tmp_path: Path, endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's profile assumes a role: botocore's STS client takes the endpoint of the
    profile's ``services`` section (``services``), or of the profile its keys come from
    (``source_profile``), which no S3 check saw; or it takes the host's instance role as
    its source (``credential_source``). Each is refused before any request, naming the
    profile; a listener named as the endpoint sees no connection."""
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".aws").mkdir()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    role = "role_arn = arn:aws:iam::123456789012:role/r\n"
    config = {
        "services": f"[default]\n{role}source_profile = src\nservices = s\n\n"
        f"[services s]\nsts =\n  endpoint_url = {url}\n\n[profile src]\nregion = us-east-1\n",
        "source_profile": f"[default]\n{role}source_profile = src\n\n"
        f"[profile src]\nregion = us-east-1\nendpoint_url = {url}\n",
        "credential_source": f"[default]\n{role}credential_source = Ec2InstanceMetadata\n",
    }[route]
    (tmp_path / ".aws" / "config").write_text(config)
    (tmp_path / ".aws" / "credentials").write_text(
        "[src]\naws_access_key_id = AKIAEXAMPLE\naws_secret_access_key = secret\n"
    )
    (tmp_path / "f").write_text("data")
    said = {
        "services": r"S3 endpoint .* \(sts endpoint_url of \[services s\] of \[default\]",
        "source_profile": r"S3 endpoint .* \(endpoint_url of \[profile src\]",
        "credential_source": r"credential_source = Ec2InstanceMetadata in \[default\]",
    }[route]
    try:
        with pytest.raises(TransferError, match=said):
            run(
                str(tmp_path / "f"),
                f"s3://{bucket}/f",
                endpoint,
                ex={"s3": {"endpoint_url": endpoint}},
            )
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()


def test_endpoint_unreachable_is_transient_and_named(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    url = f"http://127.0.0.1:{port}"
    mover = s3m.S3Download(
        MoverOptions(source=S3Options(**extra(url, retries=1, connect_timeout=1)))
    )
    with pytest.raises(TransferError, match=f"S3 endpoint not reachable: {url}") as e:
        mover.plan("s3://bkt-x/k", str(tmp_path / "k"), tree=False, glob=False)
    assert not e.value.permanent
    with pytest.raises(TransferError, match=f"S3 endpoint not reachable: {url}") as e:
        mover.plan("s3://bkt-x/p/", str(tmp_path / "p"), tree=True, glob=False)  # a LIST
    assert not e.value.permanent
    mover.close()


def test_cancel_aborts_the_multipart_upload(
    tmp_path: Path, endpoint: str, client: Any, bucket: str
) -> None:
    src = tmp_path / "big"
    src.write_bytes(os.urandom(30 << 20))
    opts = MoverOptions(
        source=S3Options(
            **extra(endpoint, part_size="5M", multipart_threshold="8M", max_concurrency=1)
        )
    )
    mover = s3m.S3Upload(opts)
    tasks = mover.plan(str(src), f"s3://{bucket}/big", tree=False, glob=False)
    cancel = threading.Event()

    class Stop:
        def add(self, n: int) -> None:
            cancel.set()  # after the first part

        def temp(self, path: str) -> None:
            pass

    with pytest.raises(TransferError, match="cancelled"):
        mover.copy_many(tasks, Stop(), cancel, lambda t: None)
    mover.close()
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    with pytest.raises(ClientError):
        client.head_object(Bucket=bucket, Key="big")


@pytest.mark.parametrize("now", [10, 2000, 0], ids=["shrank", "grew", "emptied"])
def test_failed_download_leaves_no_file_and_takes_back_progress(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, now: int
) -> None:
    client.put_object(Bucket=bucket, Key="k", Body=b"x" * 1000)
    mover = s3m.S3Download(MoverOptions(source=S3Options(**extra(endpoint))))
    [task] = mover.plan(f"s3://{bucket}/k", str(tmp_path / "k"), tree=False, glob=False)
    client.put_object(Bucket=bucket, Key="k", Body=b"y" * now)  # changed after planning
    added: list[int] = []

    class P:
        def add(self, n: int) -> None:
            added.append(n)

        def temp(self, path: str) -> None:
            pass

    failed = mover.copy_many([task], P(), threading.Event(), lambda t: None)
    mover.close()
    assert "changed while staging" in str(failed[task]) and failed[task].permanent
    assert sum(added) == 0 and list(tmp_path.iterdir()) == []


def test_an_empty_object_that_grew_is_refused_having_read_one_byte(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planned empty, 5 MB when read: one byte past the plan is asked for, never the whole
    object (which could be of any size, and is read into memory)."""
    from bbstage.movers.implementations.s3 import fast

    got: list[int] = []
    real = fast.FastS3.get

    async def spy(self: Any, *a: Any) -> Any:
        data = await real(self, *a)
        got.append(len(data))
        return data

    monkeypatch.setattr(fast.FastS3, "get", spy)
    client.put_object(Bucket=bucket, Key="e", Body=b"")
    mover = s3m.S3Download(MoverOptions(source=S3Options(**extra(endpoint))))
    [task] = mover.plan(f"s3://{bucket}/e", str(tmp_path / "e"), tree=False, glob=False)
    client.put_object(Bucket=bucket, Key="e", Body=b"y" * 5_000_000)
    failed = mover.copy_many([task], _NoProgress(), threading.Event(), lambda t: None)
    mover.close()
    assert "changed while staging: it has more than 0 bytes" in str(failed[task])
    assert got == [1] and list(tmp_path.iterdir()) == []


class _NoProgress:
    def add(self, n: int) -> None:
        pass

    def temp(self, path: str) -> None:
        pass


def test_unsafe_keys_are_refused() -> None:
    for rel in ["../x", "a/../../x", "/abs", "a//b", "./a"]:
        with pytest.raises(TransferError, match="not a safe relative path"):
            safe_rel(rel, "s3://b/p/" + rel)
    assert safe_rel("a/b.c", "s3://b/p/a/b.c") == "a/b.c"


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


@pytest.mark.parametrize(
    ("code", "status", "text", "permanent"),
    [
        ("NoSuchKey", 404, "no such object: s3://b/k", True),
        ("404", 404, "no such object: s3://b/k", True),
        ("NoSuchBucket", 404, "no such bucket: s3://b/", True),
        ("AccessDenied", 403, "access denied: s3://b/k (using profile 'lab'", True),
        ("InvalidAccessKeyId", 403, "bad S3 credentials for profile 'lab'", True),
        ("SignatureDoesNotMatch", 403, "bad S3 credentials for profile 'lab'", True),
        ("SlowDown", 503, "S3 error SlowDown", False),
        ("InternalError", 500, "S3 error InternalError", False),
        ("ServiceUnavailable", 503, "S3 error", False),
        ("InvalidRange", 416, "S3 error InvalidRange", True),
    ],
)
def test_error_mapping(code: str, status: int, text: str, permanent: bool) -> None:
    err = s3m.translate(client_error(code, status), "s3://b/k", "profile 'lab'", None)
    assert text in str(err) and err.permanent is permanent


def test_transport_errors_are_transient() -> None:
    import aiohttp
    from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

    e = s3m.translate(EndpointConnectionError(endpoint_url="http://h:1"), "s3://b/k", "x", "E")
    assert str(e).startswith("S3 endpoint not reachable: E") and not e.permanent
    for exc in [
        ReadTimeoutError(endpoint_url="u"),
        aiohttp.ServerDisconnectedError(),
        ConnectionResetError(),
    ]:
        assert not s3m.translate(exc, "s3://b/k", "x", "E").permanent


def test_settings_and_mapped_accounts(tmp_path: Path) -> None:
    s = s3m.S3Settings.from_config({"part_size": "32M", "files_in_flight": 4, "file_mode": "640"})
    assert (s.part_size, s.files_in_flight, s.file_mode) == (32 << 20, 4, 0o640)
    with pytest.raises(TransferError, match=r"unknown key 'partsize'"):
        s3m.S3Settings.from_config({"partsize": "32M"})
    with pytest.raises(TransferError, match="at least 5M"):
        s3m.S3Settings.from_config({"part_size": "1M"})
    creds = tmp_path / "creds"
    creds.write_text("[u2]\naws_access_key_id = K2\naws_secret_access_key = S2\n")
    conf = {
        "endpoint_url": "http://e",
        "accounts": {
            "root": {"access_key": "K", "secret_key": "S"},
            "daemon": {"profile": "u2", "credentials_file": str(creds)},
            "bin": {"profile": "missing", "credentials_file": str(creds)},
        },
    }
    assert s3m.s3_options(conf, 0, None) == S3Options(
        s3={"endpoint_url": "http://e"}, credentials={"key": "K", "secret": "S"}
    )
    assert s3m.s3_options(conf, 0, "mine") == S3Options({"endpoint_url": "http://e"}, "mine")
    assert s3m.s3_options(conf, 1, None).credentials == {"key": "K2", "secret": "S2"}
    broken = s3m.s3_options(conf, 2, None)
    assert "cannot read profile 'missing'" in (broken.credentials_error or "")
    with pytest.raises(TransferError, match="ask the administrator"):
        s3m.S3Download(MoverOptions(source=broken))


def test_upload_follows_file_links_and_skips_dir_links(
    tmp_path: Path, endpoint: str, client: Any, bucket: str
) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "real").write_text("real")
    (src / "link").symlink_to("real")
    (src / "dlink").symlink_to("d")
    run(f"{src}/", f"s3://{bucket}/l/", endpoint)
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["l/link", "l/real"]
    assert client.get_object(Bucket=bucket, Key="l/link")["Body"].read() == b"real"


def test_plan_tasks_are_file_tasks(tmp_path: Path, endpoint: str, bucket: str) -> None:
    (tmp_path / "f").write_text("x")
    mover = s3m.S3Upload(MoverOptions(source=S3Options(**extra(endpoint))))
    tasks = mover.plan(str(tmp_path / "f"), f"s3://{bucket}/f", tree=False, glob=False)
    assert [(t.dst, t.kind, t.size) for t in tasks] == [(f"s3://{bucket}/f", "file", 1)]
    assert isinstance(tasks[0], FileTask)
    assert mover.current(tasks[0]) is None
    mover.close()


def test_worker_retries_transient_batch_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    class Batch(s3m.S3Download):
        def __init__(self, options: MoverOptions) -> None:
            super().__init__(options)

        def plan(self, src: str, dst: str, *, tree: bool, glob: bool) -> list[FileTask]:
            return [FileTask("s3://b/a", "/x/a", size=1), FileTask("s3://b/b", "/x/b", size=1)]

        def current(self, task: FileTask) -> None:
            return None

        def copy_many(self, tasks, progress, cancel, done):  # type: ignore[no-untyped-def]
            calls.append([t.src for t in tasks])
            if len(calls) == 1:
                done(tasks[0])
                return {tasks[1]: TransferError("S3 error SlowDown", permanent=False)}
            for t in tasks:
                done(t)
            return {}

    monkeypatch.setattr(worker.movers, "get", lambda *_: Batch)
    conn = run("s3://b/", "/x/", "http://unused")
    assert calls == [["s3://b/a", "s3://b/b"], ["s3://b/b"]]
    assert Planned(2, 2) in conn.events


def test_create_window_from_the_servers_date() -> None:
    from bbstage.movers.implementations.s3.upload import create_window

    reply = {"ResponseMetadata": {"HTTPHeaders": {"date": "Sat, 21 Nov 2026 21:00:10 GMT"}}}
    start, end = create_window(reply, 3.0)  # type: ignore[misc]
    assert end - start == 5.0 and end == 1_795_294_811.0
    assert create_window({}, 1.0) is None


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-23T18:00:00.123Z",
        "2026-11-23T18:00:00Z",
        "2026-11-23T18:00:00+02:00",
        "Mon, 23 Nov 2026 18:00:00 GMT",
        "1700000000",
        "2026-11-23T18:00:00",
    ],  # fmt: skip
)
def test_timestamps_parse_as_botocore_parses_them(value: str) -> None:
    """The fast timestamp parser every mover's client uses (LIST's LastModified) gives what
    botocore's own gives, for every form S3 answers with."""
    from botocore.utils import parse_timestamp as botocore_parse

    from bbstage.movers.implementations.s3.timestamps import parse_timestamp

    ours, theirs = parse_timestamp(value), botocore_parse(value)
    assert ours == theirs and ours.timestamp() == theirs.timestamp()
    options = MoverOptions(
        job_id="t", source=S3Options(**{"s3": {"endpoint_url": "http://127.0.0.1:9"}})
    )
    factory = s3m.S3Download(options)._filesystem().session.get_component("response_parser_factory")
    assert factory._defaults["timestamp_parser"] is parse_timestamp


def test_an_objects_ranges_by_several_shares_make_the_file(
    tmp_path: Path, endpoint: str, client: Any, bucket: str
) -> None:
    """One object split across nodes (a ``FileRange``): each share GETs its byte
    range into the shared temporary file; the last one puts the file in place."""
    data = os.urandom((12 << 20) + 5)
    client.put_object(Bucket=bucket, Key="big", Body=data)
    dst = tmp_path / "big"
    spec = TransferSpec.between(
        f"s3://{bucket}/big",
        str(dst),
        job_id="7",
        **s3_sides(extra(endpoint, part_size="5M")),
    )
    manifests = []
    for i in (1, 2, 0):
        conn = Conn()
        share = spec.but(part=FileRange(i, 3, "0000abcd", 1 << 20))
        worker.transfer(share, worker.Reporter(conn), threading.Event())  # type: ignore[arg-type]
        manifests.append(conn.events[-1])
    assert all(isinstance(d, Done) for d in manifests), manifests
    assert sum(d.bytes for d in manifests) == len(data) and sum(d.files for d in manifests) == 1
    assert dst.read_bytes() == data
    assert os.listdir(tmp_path) == ["big"]


@pytest.mark.parametrize("threshold", ["32M", "5M"])  # pieces by one PUT, or multipart
def test_one_files_shares_upload_pieces_and_the_last_assembles_the_object(
    tmp_path: Path, endpoint: str, client: Any, bucket: str, threshold: str
) -> None:
    """One file to S3 split across nodes: each share uploads its bytes as a piece beside
    the destination, in any order, none waiting for another; the last assembles the object
    from the pieces on the server. The object whole, with the source's mtime; no piece and
    no upload left; an earlier group's pieces swept."""
    from bbstage.movers.implementations.s3 import pieces

    src = tmp_path / "big"
    src.write_bytes(os.urandom((17 << 20) + 11))
    stale = "out/.big.bbstage-7-00000001.r1of3.part"
    client.put_object(Bucket=bucket, Key=stale, Body=b"left by a failed group")
    spec = TransferSpec.between(
        str(src),
        f"s3://{bucket}/out/big",
        job_id="7",
        **s3_sides(extra(endpoint, part_size="5M", multipart_threshold=threshold)),
    )
    ends: list[Any] = [None] * 3

    def share(i: int) -> None:
        conn = Conn()
        part = spec.but(part=FileRange(i, 3, "0000abcd", 1 << 20))
        worker.transfer(part, worker.Reporter(conn), threading.Event())  # type: ignore[arg-type]
        ends[i] = conn.events[-1]

    threads = [threading.Thread(target=share, args=(i,)) for i in (2, 1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(d, Done) for d in ends), ends
    assert sum(d.bytes for d in ends) == src.stat().st_size and sum(d.files for d in ends) == 1
    body = client.get_object(Bucket=bucket, Key="out/big")
    assert body["Body"].read() == src.read_bytes()
    assert body["Metadata"]["bbstage-mtime"] == str(src.stat().st_mtime_ns)
    assert [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]] == ["out/big"]
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    # Part copies: every byte of a piece once, none over S3's largest part.
    for size in (1, 5 << 30, (5 << 30) + 1, 12 << 30):
        cuts = pieces._cuts(size)
        assert cuts[0][0] == 0 and cuts[-1][1] == size - 1
        assert all(a[1] + 1 == b[0] for a, b in zip(cuts, cuts[1:], strict=False))
        assert all(b - a + 1 <= pieces.COPY_MAX for a, b in cuts)


def test_pieces_of_two_versions_of_the_source_are_never_assembled(
    tmp_path: Path, endpoint: str, client: Any, bucket: str
) -> None:
    """Each node plans the file itself: the source was rewritten between the shares'
    plans. The last share finds pieces of another version: it fails (transiently), no
    object is made, and the pieces are removed."""
    src = tmp_path / "big"
    src.write_bytes(os.urandom(12 << 20))
    spec = TransferSpec.between(
        str(src), f"s3://{bucket}/big", job_id="7", **s3_sides(extra(endpoint))
    )

    def share(i: int) -> Any:
        conn = Conn()
        part = spec.but(part=FileRange(i, 2, "0000abcd", 1 << 20))
        worker.transfer(part, worker.Reporter(conn), threading.Event())  # type: ignore[arg-type]
        return conn.events[-1]

    assert share(0) == Done(6 << 20, 1)
    os.utime(src, ns=(1_700_000_000_000_000_000,) * 2)
    failed = share(1)
    assert isinstance(failed, Failed) and not failed.permanent
    assert "different versions" in failed.message
    assert client.list_objects_v2(Bucket=bucket).get("Contents", []) == []


def test_small_objects_in_memory_stay_within_the_byte_budget(
    tmp_path: Path, endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole small objects held at once (a GET's body until written, a file read for its
    PUT) stay within ``budget.HELD`` bytes however many files are in flight, both ways;
    several still move at once."""
    import asyncio

    from bbstage.movers.implementations.s3 import common, fast, upload

    monkeypatch.setattr(common, "HELD", 100_000)
    busy, peak = {"up": 0, "down": 0}, {"up": 0, "down": 0}

    def spied(way: str, real: Any, size: Any) -> Any:
        async def spy(*a: Any) -> Any:
            n = size(*a)
            busy[way] += n
            peak[way] = max(peak[way], busy[way])
            await asyncio.sleep(0.01)  # long enough for the others to start, if they may
            try:
                return await real(*a)
            finally:
                busy[way] -= n

        return spy

    put, get = upload.S3ObjectUpload._put, fast.FastS3.get
    monkeypatch.setattr(upload.S3ObjectUpload, "_put", spied("up", put, lambda *a: a[4].size))
    monkeypatch.setattr(fast.FastS3, "get", spied("down", get, lambda *a: a[3]))
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    for i in range(20):
        (src / f"f{i}").write_bytes(os.urandom(30_000))
    run(f"{src}/", f"s3://{bucket}/b/", endpoint, files_in_flight=20)
    run(f"s3://{bucket}/b/", f"{dst}/", endpoint, files_in_flight=20)
    assert peak == {"up": 90_000, "down": 90_000}  # three of 30,000 within 100,000
    assert {p.name: file_digest(p) for p in dst.iterdir()} == {
        p.name: file_digest(p) for p in src.iterdir()
    }


def test_objects_read_whole_above_fast_max_are_bounded_by_max_concurrency(
    tmp_path: Path, endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Single PUTs hold the file in memory: those above ``FAST_MAX`` (up to
    ``multipart_threshold``) take a part slot, so at most ``max_concurrency`` at once,
    however many files are in flight; smaller ones are not held back."""
    import asyncio

    from bbstage.movers.implementations.s3 import upload

    monkeypatch.setattr(upload, "FAST_MAX", 50_000)
    busy, peak = {"big": 0, "small": 0}, {"big": 0, "small": 0}
    real = upload.S3ObjectUpload._put

    async def spy(self: Any, s3: Any, bucket: str, key: str, task: FileTask, *a: Any) -> None:
        kind = "big" if task.size > 50_000 else "small"
        busy[kind] += 1
        peak[kind] = max(peak[kind], busy[kind])
        await asyncio.sleep(0.02)  # long enough for the others to start, if they may
        try:
            await real(self, s3, bucket, key, task, *a)
        finally:
            busy[kind] -= 1

    monkeypatch.setattr(upload.S3ObjectUpload, "_put", spy)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"big{i}").write_bytes(os.urandom(60_000))
        (src / f"small{i}").write_bytes(os.urandom(100))
    run(f"{src}/", f"s3://{bucket}/m/", endpoint, files_in_flight=12, max_concurrency=2)
    assert peak == {"big": 2, "small": peak["small"]} and peak["small"] > 2
    dst = tmp_path / "dst"
    run(f"s3://{bucket}/m/", f"{dst}/", endpoint)
    assert {p.name: file_digest(p) for p in dst.iterdir()} == {
        p.name: file_digest(p) for p in src.iterdir()
    }
