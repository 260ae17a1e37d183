"""The generic backends adopt the shared suite (``abstract.BackendSuite``), each against its
server of scripts/local-stores: GCS (gcp-storage-emulator), Azure Blob (Azurite), SFTP
(OpenSSH), HTTPS (a static server with a test CA, trusted through ``[https] ca_bundle``:
verification stays on)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bbstage.movers.base import TransferError
from bbstage.movers.implementations.fsstore import StoreOptions
from bbstage.transfer import Done, Failed, TransferSpec
from tests.backends.abstract import ODD, BackendSuite
from tests.backends.stores import (
    Store,
    allow_local,
    azure_account,
    open_store,
    stores_env,
    user_home,
)

__all__ = ["stores_env"]  # the session fixture, registered here


class TestGCS(BackendSuite):
    # gcp-storage-emulator cuts an object name at ";" (its URL parser); GCS keeps it
    odd = ODD.replace(";", "")

    def data(self, n: int, seed: int = 0) -> bytes:
        # gcp-storage-emulator parses a multipart upload with Python's email parser, which
        # drops a body's trailing b"\r" (1 random body in 256; seen in CI); GCS keeps it
        body = super().data(n, seed)
        return body[:-1] + b"\n" if body.endswith(b"\r") else body

    @pytest.fixture
    def store(self, stores_env: dict[str, str]) -> Iterator[Store]:
        options = StoreOptions(
            {"endpoint_url": stores_env["BBSTAGE_GS_ENDPOINT"], "anonymous": "true"}
        )
        yield from open_store("gs", stores_env, options)


class TestAzure(BackendSuite):
    @pytest.fixture
    def store(
        self, stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[Store]:
        user_home(tmp_path, monkeypatch)  # the user's connection string, in their home
        yield from open_store("az", stores_env, StoreOptions({}))


class TestSFTP(BackendSuite):
    @pytest.fixture
    def store(
        self, stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[Store]:
        user_home(tmp_path, monkeypatch)  # the user's key and known_hosts
        yield from open_store("sftp", stores_env, StoreOptions({}))


class TestHTTPS(BackendSuite):
    resumes = False  # fsspec's HTTP reads no Last-Modified: a resumed transfer copies again
    directories = False  # HTTP has none: https://host/d is the page the server sends there

    @pytest.fixture
    def store(self, stores_env: dict[str, str]) -> Iterator[Store]:
        options = StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]})
        yield from open_store("https", stores_env, options)


def test_an_unknown_sftp_host_key_is_refused(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's known_hosts decides: a server whose key is not in it is never trusted."""
    home = user_home(tmp_path, monkeypatch)
    (home / ".ssh" / "known_hosts").write_text("")
    user, port = stores_env["BBSTAGE_SFTP_USER"], stores_env["BBSTAGE_SFTP_PORT"]
    url = f"sftp://{user}@127.0.0.1:{port}/etc/hostname"
    events = BackendSuite().run(_no_store("sftp", stores_env), url, str(tmp_path / "x"))
    assert isinstance(events[-1], Failed) and "127.0.0.1" in events[-1].message, events[-1]
    assert not (tmp_path / "x").exists()


def test_sftp_speaks_aes_gcm_where_the_cpu_has_aes(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cipher the real sshd agreed to: AES-GCM where the CPU has AES instructions (a
    third of chacha20-poly1305's CPU for 1 GiB up, docs/performance.md), asyncssh's own
    first choice where it has not."""
    from bbstage.movers.implementations.sftp import cpu_has_aes

    user_home(tmp_path, monkeypatch)
    gen = open_store("sftp", stores_env, StoreOptions({}))
    store = next(gen)
    try:
        store.put("c", b"cipher")
        cipher = store.fs.client.get_extra_info("send_cipher")
        assert cipher == (
            "aes128-gcm@openssh.com" if cpu_has_aes() else "chacha20-poly1305@openssh.com"
        )
    finally:
        next(gen, None)


def test_https_is_verified_without_the_sites_ca_bundle_it_fails(
    stores_env: dict[str, str], tmp_path: Path
) -> None:
    """TLS is verified: the test CA is trusted only through [https] ca_bundle. Each of
    the clients refuses the server: sizes', small files' and ranges' (libcurl), listings'
    (fsspec's aiohttp)."""
    import ssl

    from bbstage import movers

    (Path(stores_env["BBSTAGE_HTTPS_ROOT"]) / "verify.dat").write_bytes(b"x")
    url = stores_env["BBSTAGE_HTTPS_URL"] + "/verify.dat"
    store = _no_store("https", stores_env)
    events = BackendSuite().run(store, url, str(tmp_path / "x"))
    assert isinstance(events[-1], Failed) and "certificate" in events[-1].message.lower()
    assert not (tmp_path / "x").exists()
    https = movers.backend("https")
    fs = https.filesystem(store.options, url)
    for read in (
        lambda: https.info(fs, url),
        lambda: https.read(fs, url, 1),
        lambda: https.read_range(fs, url, 0, 1, lambda at, data: None),
        lambda: fs.ls(stores_env["BBSTAGE_HTTPS_URL"] + "/"),
    ):
        with pytest.raises(ssl.SSLCertVerificationError):
            read()


def _no_store(kind: str, env: dict[str, str]) -> Store:
    """Options as the daemon's without a table of ``kind`` (but the local server allowed)."""
    return Store(kind, "", allow_local(kind, env, StoreOptions({})), None)


def test_store_to_store_streams_through_the_worker(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any source to any destination: GCS to Azure, Azure to SFTP, HTTPS to GCS (a file and a
    tree), bytes compared; the generic mover streams them, nothing lands on a local disk."""
    user_home(tmp_path, monkeypatch)
    gs_options = StoreOptions(
        {"endpoint_url": stores_env["BBSTAGE_GS_ENDPOINT"], "anonymous": "true"}
    )
    https_options = StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]})
    gs = open_store("gs", stores_env, gs_options)
    az = open_store("az", stores_env, StoreOptions({}))
    sftp = open_store("sftp", stores_env, StoreOptions({}))
    https = open_store("https", stores_env, https_options)
    stores = {s.kind: s for s in (next(gs), next(az), next(sftp), next(https))}
    try:
        body, small = os.urandom(9 << 20), b"tree file"
        stores["gs"].put("f.dat", body)
        stores["gs"].put("t/a/one", small)
        stores["https"].put("h.dat", body[:1000])
        for (a, b), name in [
            (("gs", "az"), "f.dat"),
            (("az", "sftp"), "from-gs"),
            (("https", "gs"), "h.dat"),
        ]:
            spec = TransferSpec.between(
                stores[a].url(name), stores[b].url(f"from-{a}"), job_id="s2s",
                source_options=stores[a].options, destination_options=stores[b].options,
            )  # fmt: skip
            events = _run(spec)
            assert isinstance(events[-1], Done), events[-1]
            assert stores[b].get(f"from-{a}") == (body[:1000] if a == "https" else body)
        spec = TransferSpec.between(
            stores["gs"].url("t/"), stores["sftp"].url("t/"), job_id="s2s",
            source_options=gs_options, destination_options=stores["sftp"].options,
        )  # fmt: skip
        assert isinstance(_run(spec)[-1], Done)
        assert stores["sftp"].get("t/a/one") == small
        assert not list(tmp_path.glob("**/*.part"))
    finally:
        for gen in (gs, az, sftp, https):
            next(gen, None)


def _run(spec: TransferSpec) -> list[object]:
    import threading

    from bbstage.transfer import worker
    from tests.helpers import Conn

    conn = Conn()
    worker.transfer(spec, worker.Reporter(conn), threading.Event())  # type: ignore[arg-type]
    return conn.events


@pytest.mark.parametrize("kind", ["gs", "az", "sftp", "https"])
def test_a_big_download_in_ranges_lands_whole_and_a_cancel_leaves_nothing(
    kind: str, stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranged reads written in place (1 MiB ranges here: 12 of them, 4 at once): the bytes
    are the object's; cancelled after the first range, no temporary file is left."""
    from bbstage import movers

    monkeypatch.setattr(movers.backend(kind), "ranges", (1 << 20, 4))
    user_home(tmp_path, monkeypatch)
    options = {
        "gs": StoreOptions(
            {"endpoint_url": stores_env["BBSTAGE_GS_ENDPOINT"], "anonymous": "true"}
        ),
        "https": StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]}),
    }.get(kind, StoreOptions({}))
    gen = open_store(kind, stores_env, options)
    store = next(gen)
    try:
        body = os.urandom((12 << 20) + 12345)
        store.put("big", body)
        out = tmp_path / "out"
        out.mkdir()
        suite = BackendSuite()
        assert isinstance(suite.run(store, store.url("big"), str(out / "big"))[-1], Done)
        assert (out / "big").read_bytes() == body
        import threading

        from bbstage.transfer import worker
        from tests.backends.abstract import _StopAtFirstBytes
        from tests.helpers import Conn

        cancel, conn = threading.Event(), Conn()
        spec = suite.spec(store, store.url("big"), str(out / "again"))
        worker.transfer(spec, _StopAtFirstBytes(conn, cancel), cancel)  # type: ignore[arg-type]
        assert isinstance(conn.events[-1], Failed) and conn.events[-1].message == "cancelled"
        assert sorted(p.name for p in out.iterdir()) in (["big"], ["again", "big"])
        if (out / "again").exists():
            assert (out / "again").read_bytes() == body
    finally:
        next(gen, None)


@pytest.mark.parametrize("kind", ["https", "az", "sftp"])
def test_a_big_file_replaced_while_it_is_staged_lands_whole_in_one_version(
    kind: str, stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source of a big download (1 MiB ranges here, 2 at once) is replaced by a file of
    the same size after its first ranges are read: what lands is one version whole (the
    next try reads the new one), never the old file's first ranges with the new one's
    last; the sha256 of the bytes says which."""
    import hashlib

    from bbstage import movers

    backend = movers.backend(kind)
    monkeypatch.setattr(backend, "ranges", (1 << 20, 2))
    user_home(tmp_path, monkeypatch)
    ca = {"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]} if kind == "https" else {}
    gen = open_store(kind, stores_env, StoreOptions(ca))
    store = next(gen)
    old, new = os.urandom((12 << 20) + 12345), os.urandom((12 << 20) + 12345)
    calls: list[int] = []
    read_range = backend.read_range

    def replacing(fs: Any, path: str, start: int, end: int, into: Any) -> int:
        calls.append(start)
        if len(calls) == 3:  # two ranges of the old file read
            if kind == "az":
                store.put("big", new)
            else:  # renamed into place whole: no range reads a file half written
                local = store.local_root / "big" if store.local_root else Path(path)
                fresh = local.with_name("big.new")
                fresh.write_bytes(new)
                later = time.time() + 10
                os.utime(fresh, (later, later))
                os.chown(fresh, local.stat().st_uid, local.stat().st_gid)
                os.replace(fresh, local)
        return int(read_range(fs, path, start, end, into))

    monkeypatch.setattr(backend, "read_range", replacing)
    try:
        store.put("big", old)
        out = tmp_path / "out"
        out.mkdir()
        events = BackendSuite().run(store, store.url("big"), str(out / "big"))
        assert isinstance(events[-1], Done), events[-1]
        got = hashlib.sha256((out / "big").read_bytes()).hexdigest()
        assert got == hashlib.sha256(new).hexdigest()
        assert len(calls) > 13  # read again, whole
    finally:
        next(gen, None)


def test_an_https_directory_the_index_names_but_cannot_be_listed_fails_the_tree(
    stores_env: dict[str, str], tmp_path: Path
) -> None:
    """A tree's index names a directory whose own listing then fails (404: gone a moment
    later, or a server's fault): the tree fails, never staged without that directory's
    files (fsspec's ``find`` left them out, and the transfer said done); one listing per
    directory (fsspec's asked the root's twice, and its info)."""
    from bbstage import movers

    https = movers.backend("https")
    asked: list[str] = []
    www = tmp_path / "www"
    (www / "t" / "d").mkdir(parents=True)
    (www / "t" / "f").write_bytes(b"f" * 100)
    (www / "t" / "d" / "g").write_bytes(b"g" * 100)

    def do_GET(self: Any) -> None:  # noqa: N802 - http.server's name
        asked.append(self.path)
        if self.path == "/t/d/":
            self.send_error(404)
            return
        http_server.SimpleHTTPRequestHandler.do_GET(self)

    import http.server as http_server

    with _tls_server(stores_env, www, do_GET=do_GET) as port:
        url = f"https://127.0.0.1:{port}/t/"
        fs = _allowed(stores_env, port, url)
        with pytest.raises(FileNotFoundError):
            https.find(fs, url.rstrip("/"))
        assert asked.count("/t/") == 1, asked
        ca = {"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"], "allowed_hosts": [f"127.0.0.1:{port}"]}
        out = tmp_path / "out"
        spec = TransferSpec.between(url, f"{out}/", job_id="t", source_options=StoreOptions(ca))
        events = _run(spec)
        assert isinstance(events[-1], Failed), events[-1]
        assert not (out / "f").exists() or (out / "d" / "g").exists()


@pytest.mark.parametrize("without_end", ["deep", "wide", "long"])
def test_an_https_tree_whose_indexes_have_no_end_fails_bounded(
    without_end: str, stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that generates its indexes (a user's own, or one that lists a directory
    under itself) is listed only so far, then the tree fails, permanently, saying what to
    do, nothing staged: ``deep``, each directory's index names a directory below it
    (``TREE_DEEPEST``, 128); ``wide``, each names ten (``TREE_MOST`` entries, here 200); ``long``,
    one index page without end (``INDEX_MOST`` bytes, here 64 KiB: aiohttp's own read
    takes a body of any length into memory)."""
    from bbstage import movers
    from bbstage.movers.implementations import https as impl

    # (each bound small enough that the others end a test whose own bound is gone)
    monkeypatch.setattr(impl, "TREE_MOST", 200 if without_end == "wide" else 1000)
    monkeypatch.setattr(impl, "INDEX_MOST", 64 << 10)
    listed: list[str] = []

    def do_GET(self: Any) -> None:  # noqa: N802 - http.server's name
        if self.path.rstrip("/").rpartition("/")[2].startswith("f"):
            self.send_error(404)  # (a file: never read, the tree fails before)
            return
        listed.append(self.path)
        names = {"deep": ["d"], "wide": [f"d{i}" for i in range(10)], "long": []}[without_end]
        page = "".join(f'<a href="{n}/">{n}/</a>\n' for n in names) + '<a href="f">f</a>\n'
        if without_end == "long":
            page += "".join(f'<a href="f{i:07d}">f</a>\n' for i in range(20_000))  # ~600 KiB
        body = page.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass  # the client stopped reading, as it should

    with _served(stores_env, tmp_path, "/t/", do_GET=do_GET) as (url, fs):
        https = movers.backend("https")
        with pytest.raises(TransferError) as failed:
            https.find(fs, url.rstrip("/"))
        assert failed.value.permanent
        said = {
            "deep": f"more than directories {impl.TREE_DEEPEST} deep",
            "wide": "more than 200 files and directories",
            "long": "sent more than 65536 bytes",
        }[without_end]
        assert said in str(failed.value) and "stage a part of it" in str(failed.value)
        assert len(listed) <= {"deep": impl.TREE_DEEPEST + 1, "wide": 21, "long": 1}[without_end], (
            listed
        )
        ca = {"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"], "allowed_hosts": [url.split("/")[2]]}
        out = tmp_path / "out"
        spec = TransferSpec.between(url, f"{out}/", job_id="t", source_options=StoreOptions(ca))
        events = _run(spec)
        assert isinstance(events[-1], Failed) and said in events[-1].message, events[-1]
        assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(
    "name",
    ["a/../../escaped", "%2e%2e/escaped", "/t/../escaped"],
    ids=["dot-dot", "encoded-dot-dot", "absolute"],
)
def test_a_name_a_store_lists_that_leads_out_of_the_destination_is_refused(
    name: str, stores_env: dict[str, str], tmp_path: Path
) -> None:
    """A tree's listing names a file whose name leads out of the destination: a link of a
    server's index (a careless or hostile site: ``..`` plain, percent-encoded, or in an
    absolute link). The transfer fails, permanently, naming it, before a byte is written:
    nothing lands outside the destination, nor in it. The rule is the generic mover's, for
    every store's names (an S3 key's: ``test_unsafe_keys_are_refused``); the local stores
    hold no such name (Azure's URLs resolve dot segments, the GCS emulator refuses them)."""
    import http.server as http_server

    out = tmp_path / "deep" / "out"
    out.parent.mkdir()
    www = tmp_path / "www"
    (www / "t").mkdir(parents=True)
    for path in ("t/ok", "t/escaped", "escaped"):
        (www / path).write_bytes(b"hostile")

    def do_GET(self: Any) -> None:  # noqa: N802 - http.server's name
        if self.path != "/t/":
            http_server.SimpleHTTPRequestHandler.do_GET(self)
            return
        body = f'<a href="ok">ok</a>\n<a href="{name}">x</a>\n'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    with _tls_server(stores_env, www, do_GET=do_GET) as port:
        url = f"https://127.0.0.1:{port}/t/"
        ca = {"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]}
        options = StoreOptions({**ca, "allowed_hosts": [f"127.0.0.1:{port}"]})
        spec = TransferSpec.between(url, f"{out}/", job_id="t", source_options=options)
        events = _run(spec)
    assert isinstance(events[-1], Failed), events[-1]
    assert "not a safe relative path" in events[-1].message, events[-1].message
    assert not [p for p in tmp_path.rglob("*") if p.name == "escaped" and "www" not in p.parts]
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]


@contextlib.contextmanager
def _listener(host: str, port: int = 0) -> Iterator[tuple[int, list[object]]]:
    """A TCP listener (its port, and the connections it saw): each connection is closed at
    once, so a client that reaches it fails at once instead of waiting."""
    listener = socket.create_server((host, port))
    listener.settimeout(0.05)
    seen: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            seen.append(conn)
            conn.close()

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        stop.set()
        thread.join()
        listener.close()


@pytest.mark.parametrize("kind", ["https", "sftp"])
def test_a_host_the_site_has_not_allowed_is_never_reached(
    kind: str, stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's https:// or sftp:// URL reaches only the hosts of ``[https|sftp]
    allowed_hosts``: a listener on 127.0.0.1, not listed (the local server is), sees no
    connection; the transfer fails naming the URL and the key to set. HTTPS also checks each
    connection its client opens (a redirect's), and its blocking client each URL it reads: the
    filesystem made for an allowed URL is refused the listener's too."""
    from bbstage import movers

    user_home(tmp_path, monkeypatch)
    with _listener("127.0.0.1") as (port, seen):
        user = stores_env["BBSTAGE_SFTP_USER"]
        url = (
            f"https://127.0.0.1:{port}/x"
            if kind == "https"
            else f"sftp://{user}@127.0.0.1:{port}/x"
        )
        options = (
            StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]})
            if kind == "https"
            else StoreOptions({})
        )
        store = Store(kind, "", allow_local(kind, stores_env, options), None)
        events = BackendSuite().run(store, url, str(tmp_path / "x"))
        assert isinstance(events[-1], Failed), events[-1]
        assert url in events[-1].message, events[-1].message
        assert f"[{kind}] allowed_hosts" in events[-1].message, events[-1].message
        if kind == "https":  # the client itself: a redirect goes through the same connector
            allowed = stores_env["BBSTAGE_HTTPS_URL"] + "/"
            fs = movers.backend(kind).filesystem(store.options, allowed)
            with pytest.raises(TransferError, match=r"\[https\] allowed_hosts"):
                fs.cat_file(url)
            with pytest.raises(TransferError, match=r"\[https\] allowed_hosts"):  # its reads
                movers.backend(kind).read_range(fs, url, 0, 10, lambda at, data: None)
            with pytest.raises(TransferError, match=r"\[https\] allowed_hosts"):
                movers.backend(kind).read(fs, url, 10)
        assert not (tmp_path / "x").exists()
    assert not seen, "a host the site did not allow was reached"


def test_an_azure_endpoint_the_site_has_not_allowed_is_never_reached(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint of a user's Azure connection string is reached only when the site
    allows it (``[az] allowed_endpoints``; Azure's own over https): a listener on
    127.0.0.1 named as the endpoint, not listed (Azurite is), sees no connection, and the
    transfer fails naming the endpoint and the key to set; an endpoint listed over https
    is not one over http. An allowed endpoint that redirects elsewhere (Azure's service
    sends no redirect) is not followed there."""
    import http.server

    from bbstage import movers

    home = user_home(tmp_path, monkeypatch)
    conn = home / ".config/bbstage/azure-connection-string"
    key = azure_account(conn.read_text())

    def point_at(endpoint: str) -> None:
        conn.write_text(
            f"DefaultEndpointsProtocol=http;AccountName={key['AccountName']};"
            f"AccountKey={key['AccountKey']};BlobEndpoint={endpoint}/{key['AccountName']};"
        )

    az = movers.backend("az")
    local = allow_local("az", stores_env, StoreOptions({}))
    with _listener("127.0.0.1") as (port, seen):
        for listed in ([], [f"https://127.0.0.1:{port}"], [f"127.0.0.1:{port}"]):
            point_at(f"http://127.0.0.1:{port}")
            options = StoreOptions(
                {"allowed_endpoints": [*local.settings["allowed_endpoints"], *listed]}
            )
            store = Store("az", "", options, None)
            events = BackendSuite().run(store, "az://bbstage-test/x", str(tmp_path / "x"))
            assert isinstance(events[-1], Failed), events[-1]
            said = events[-1].message
            assert f"http://127.0.0.1:{port}" in said and "[az] allowed_endpoints" in said, said

        # allowed, and redirecting every request to the listener
        def do_GET(self: Any) -> None:  # noqa: N802 - http.server's name
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{port}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        handler = type(
            "Redirects",
            (http.server.BaseHTTPRequestHandler,),
            {"do_GET": do_GET, "do_HEAD": do_GET, "protocol_version": "HTTP/1.1",
             "log_message": lambda *a: None},
        )  # fmt: skip
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            there = f"http://127.0.0.1:{server.server_address[1]}"
            point_at(there)
            store = Store("az", "", StoreOptions({"allowed_endpoints": [there]}), None)
            for url in ("az://bbstage-test/x", "az://bbstage-test/t/"):
                events = BackendSuite().run(store, url, str(tmp_path / "x") + url[-1:])
                assert isinstance(events[-1], Failed), events[-1]
            fs = az.filesystem(store.options, "az://bbstage-test/x")
            with pytest.raises(TransferError, match="redirected it"):
                az.read(fs, "bbstage-test/x", 10)
            with pytest.raises(TransferError, match="redirected it"):
                az.read_range(fs, "bbstage-test/x", 0, 10, lambda at, data: None)
        finally:
            server.shutdown()
            server.server_close()
        assert not (tmp_path / "x").exists()
    assert not seen, "an endpoint the site did not allow was reached"


@pytest.mark.parametrize(
    "credentials",
    [
        {"type": "authorized_user", "client_id": "c", "client_secret": "s",
         "refresh_token": "r", "token_uri": "http://127.0.0.1:{port}/token"},
        {"type": "external_account", "audience": "a", "subject_token_type": "t",
         "token_url": "https://sts.googleapis.com/v1/token",
         "credential_source": {"url": "http://127.0.0.1:{port}/subject"}},
    ],
    ids=["token_uri", "credential_source.url"],
)  # fmt: skip
def test_google_credentials_that_name_another_host_never_reach_it(
    credentials: dict[str, Any], stores_env: dict[str, str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A user's application default credentials name the URLs google-auth sends requests
    to (a refresh token to ``token_uri``): one that is not Google's over https fails the
    transfer before any request, naming the file and the key; a listener named there sees
    no connection."""
    import json

    home = user_home(tmp_path, monkeypatch)
    adc = home / ".config/gcloud/application_default_credentials.json"
    adc.parent.mkdir(parents=True)
    with _listener("127.0.0.1") as (port, seen):
        text = json.dumps(credentials).replace("{port}", str(port))
        adc.write_text(text)
        key = next(k for k in ("token_uri", "credential_source") if k in credentials)
        options = StoreOptions({"endpoint_url": stores_env["BBSTAGE_GS_ENDPOINT"]})
        store = Store("gs", "", options, None)
        events = BackendSuite().run(store, "gs://bbstage-test/x", str(tmp_path / "x"))
        assert isinstance(events[-1], Failed), events[-1]
        said = events[-1].message
        assert str(adc) in said and key in said and f"127.0.0.1:{port}" in said, said
        assert not (tmp_path / "x").exists()
    assert not seen, "a host the user's credentials named was reached"


def test_a_user_without_google_credentials_is_anonymous_never_the_hosts_account(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """google-auth's default chain ends at the host's own service account (GCE's metadata
    server) when the user has no credentials file: a user's transfer is anonymous then
    (public buckets; the emulator's), and the metadata server is never asked; with a file,
    its credentials, loaded from it alone. (The host here is faked on GCE.)"""
    import json

    from google.auth.compute_engine import _metadata
    from google.auth.exceptions import TransportError

    from bbstage import movers

    asked: list[object] = []
    monkeypatch.setattr(_metadata, "is_on_gce", lambda *a, **k: asked.append(a) or True)
    monkeypatch.setattr(_metadata, "ping", lambda *a, **k: asked.append(a) or True)

    def get(*a: Any, **k: Any) -> Any:  # the host's token: refused at once, not waited for
        asked.append(a)
        raise TransportError("the fake host's metadata server")

    monkeypatch.setattr(_metadata, "get", get)
    home = user_home(tmp_path, monkeypatch)
    gen = open_store(
        "gs",
        stores_env,
        StoreOptions({"endpoint_url": stores_env["BBSTAGE_GS_ENDPOINT"], "anonymous": "true"}),
    )
    store = next(gen)
    try:
        store.put("x", b"public")
        options = StoreOptions({"endpoint_url": stores_env["BBSTAGE_GS_ENDPOINT"]})
        own = Store("gs", store.url(""), options, None)
        events = BackendSuite().run(own, store.url("x"), str(tmp_path / "x"))
        assert isinstance(events[-1], Done), events[-1]
        assert (tmp_path / "x").read_bytes() == b"public"
        gs = movers.backend("gs")
        assert gs.filesystem(options, store.url("x")).credentials.method == "anon"
        adc = home / ".config/gcloud/application_default_credentials.json"
        adc.parent.mkdir(parents=True)
        adc.write_text(json.dumps({"type": "authorized_user", "client_id": "c",
                                   "client_secret": "s", "refresh_token": "r"}))  # fmt: skip
        fs = gs.filesystem(options, store.url("x"))
        assert fs.credentials.credentials.refresh_token == "r"
        assert not asked, "the host's metadata server was asked"
    finally:
        next(gen, None)


def test_https_reads_go_through_no_proxy_the_environment_names(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's environment may name a proxy (``https_proxy``, ``all_proxy`` ...): HTTPS
    reads go straight to the allowed host, a file by ranges, a tree's small files and their
    sizes alike; a listener named as every proxy sees no connection."""
    with _listener("127.0.0.1") as (port, seen):
        for name in ("http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
            monkeypatch.setenv(name.upper(), f"http://127.0.0.1:{port}")
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        gen = open_store(
            "https", stores_env, StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]})
        )
        store = next(gen)
        try:
            files = {"p/big": os.urandom(9 << 20), "p/t/a": b"a" * 1000, "p/t/b": b"b" * 10}
            for name, data in files.items():
                store.put(name, data)
            suite = BackendSuite()
            events = suite.run(store, store.url("p/big"), str(tmp_path / "p" / "big"))
            assert isinstance(events[-1], Done), events[-1]
            events = suite.run(store, store.url("p/t/"), str(tmp_path / "p" / "t") + "/")
            assert isinstance(events[-1], Done) and events[-1].files == 2, events[-1]
            assert all((tmp_path / k).read_bytes() == v for k, v in files.items())
        finally:
            next(gen, None)
    assert not seen, "a read went through the proxy the environment names"


def test_a_size_that_fails_once_is_asked_again_and_the_tree_is_staged(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sizes a listing lacks are asked as the plan is read (``Backend.infos``), eagerly
    or as they come: a transient failure of either kind is asked again (``retrying.FILE``),
    and the tree is staged whole, bytes compared."""
    from bbstage import movers

    https = movers.backend("https")
    lazy = https.infos
    gen = open_store(
        "https", stores_env, StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]})
    )
    store = next(gen)
    try:
        files = {f"r/f{i}": os.urandom(100 + i) for i in range(5)}
        for name, data in files.items():
            store.put(name, data)
        for eager in (True, False):
            failures = [TransferError("HTTP 503 Slow Down", permanent=False)]

            def flaky(
                fs: Any, paths: list[str], eager: bool = eager, failures: list[Any] = failures
            ) -> Any:
                if failures:
                    failure = failures.pop()
                    if eager:
                        raise failure

                    def fail_later() -> Any:
                        yield from lazy(fs, paths[:2])
                        raise failure

                    return fail_later()
                return lazy(fs, paths)

            monkeypatch.setattr(https, "infos", flaky)
            out = tmp_path / f"eager-{eager}"
            events = BackendSuite().run(store, store.url("r/"), str(out) + "/")
            assert isinstance(events[-1], Done) and events[-1].files == 5, events[-1]
            assert not failures
            assert all((out / k[2:]).read_bytes() == v for k, v in files.items())
    finally:
        next(gen, None)


def test_allowed_hosts_in_the_daemon_config_are_checked() -> None:
    """``allowed_hosts``: a list of host or host:port; anything else is refused at load."""
    from bbstage import movers

    https = movers.backend("https")
    https.check_settings({"allowed_hosts": ["data.example.org", "Mirror.Example.org:8443"]})
    https.check_host({"allowed_hosts": ["data.example.org"]}, "https://data.example.org/a")
    https.check_host(
        {"allowed_hosts": ["mirror.example.org:8443"]}, "https://MIRROR.example.org:8443/a"
    )
    for bad in (
        "data.example.org",
        ["https://x.org"],
        ["x.org:port"],
        ["x.org:99999"],
        ["x.org/a"],
        [443],
    ):
        with pytest.raises(TransferError, match=r"\[https\] allowed_hosts"):
            https.check_settings({"allowed_hosts": bad})
    for url in ("https://data.example.org:8443/a", "https://other.org/a"):
        with pytest.raises(TransferError, match=r"not allowed on this site"):
            https.check_host({"allowed_hosts": ["data.example.org"]}, url)
    movers.backend("sftp").check_host(
        {"allowed_hosts": ["dtn.example.org"]}, "sftp://u@dtn.example.org/x"
    )


def test_a_hosts_judgement_kept_for_a_url_holds_for_each_url_that_shares_its_host() -> None:
    """A client's check keeps its judgement of each URL's part before the path: whatever
    URLs were judged before, each is judged as its own host says (``urlsplit``'s
    netloc), tricky ones too (a user name, a query or fragment in place of a path, an
    empty or bracketed host, no "//", controls that urlsplit removes)."""
    import random
    import urllib.parse

    from bbstage import movers

    https = movers.backend("https")
    settings = {"allowed_hosts": ["data.example.org", "[::1]:8443"]}
    rule = https.site_rule(settings)
    assert rule is not None
    urls = [
        "https://data.example.org/a", "https://data.example.org:443/b", "https://evil.org/a",
        "https://data.example.org@evil.org/a", "https://evil.org@data.example.org/a",
        "https://data.example.org?x=/a", "https://evil.org?data.example.org/",
        "https://data.example.org#/a", "https://evil.org#/data.example.org/",
        "https:///data.example.org/a", "https:data.example.org/a", "data.example.org/a",
        "https://[::1]:8443/a", "https://[::1/a", "https://[::1]:8443@evil.org/a",
        "https://data.exa\tmple.org/a", "https://data.example.org\n/a", "https://evil.org\n",
        "https://DATA.example.org/x", "https://data.example.org:0443/x", "",
    ]  # fmt: skip

    def refused(url: str) -> bool:
        try:
            return rule.refused_host(urllib.parse.urlsplit(url).netloc) is not None
        except ValueError:
            return rule.refused_host("") is not None

    for seed in range(20):
        check = https.host_check(settings)  # a client's: it keeps what it judged
        for url in random.Random(seed).choices(urls, k=200):
            try:
                check(url)
                taken = True
            except TransferError:
                taken = False
            assert taken == (not refused(url)), url


def test_the_users_ssh_config_does_not_send_an_sftp_transfer_elsewhere(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host checked against ``[sftp] allowed_hosts`` is the one reached: a user's
    ``~/.ssh/config`` naming another ``HostName`` for it is not read (a listener there sees
    no connection; the allowed server's file arrives)."""
    home = user_home(tmp_path, monkeypatch)
    port = int(stores_env["BBSTAGE_SFTP_PORT"])
    (home / ".ssh" / "config").write_text("Host 127.0.0.1\n  HostName 127.0.0.2\n")
    gen = open_store("sftp", stores_env, StoreOptions({}))
    store = next(gen)
    try:
        store.put("a", b"allowed")
        with _listener("127.0.0.2", port) as (_, seen):
            events = BackendSuite().run(store, store.url("a"), str(tmp_path / "a"))
        assert not seen, "the user's ~/.ssh/config sent the transfer to another host"
        BackendSuite().done(events)
        assert (tmp_path / "a").read_bytes() == b"allowed"
    finally:
        next(gen, None)


def test_an_sftp_directory_removed_after_the_mover_made_it_is_made_again(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small file is written to SFTP without asking again for each part of its directory
    (the mover made it, once per transfer); a directory removed since is made again, and
    the file lands with its bytes."""
    from bbstage import movers

    user_home(tmp_path, monkeypatch)
    gen = open_store("sftp", stores_env, StoreOptions({}))
    store = next(gen)
    backend = movers.backend("sftp")
    write, removed = backend.write.__func__, []  # type: ignore[attr-defined]

    def remove_first(cls: Any, fs: Any, path: str, data: bytes) -> None:
        if not removed:  # another process of the user's empties the directory tree
            removed.append(os.path.dirname(path))
            fs.rm(os.path.dirname(path), recursive=True)
        write(cls, fs, path, data)

    monkeypatch.setattr(backend, "write", classmethod(remove_first))
    try:
        (tmp_path / "f").write_bytes(b"small file")
        events = BackendSuite().run(store, str(tmp_path / "f"), store.url("new/f"))
        BackendSuite().done(events)
        assert removed and store.get("new/f") == b"small file"
    finally:
        next(gen, None)


def test_a_server_that_answers_a_range_with_the_whole_file_is_refused(
    stores_env: dict[str, str], tmp_path: Path
) -> None:
    """HTTPS ranges are streamed into place as they arrive (``read_range``): a server that
    ignores ``Range`` and sends the whole file (200, as Python's own http.server does), its
    length said or not (chunked), is refused before a byte is handed on, as a transient
    failure (a mirror behind it may answer the next try)."""
    from bbstage import movers

    def chunked(self: Any) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for _ in range(3):
            self.wfile.write(b"%x\r\n%s\r\n" % (1 << 16, b"x" * (1 << 16)))
        self.wfile.write(b"0\r\n\r\n")

    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "big").write_bytes(os.urandom(3 << 20))
    for methods in ({}, {"do_GET": chunked}):
        with _tls_server(stores_env, tmp_path / "www", **methods) as port:
            https = movers.backend("https")
            options = StoreOptions(
                {
                    "ca_bundle": stores_env["BBSTAGE_HTTPS_CA"],
                    "allowed_hosts": [f"127.0.0.1:{port}"],
                }
            )
            url = f"https://127.0.0.1:{port}/big"
            fs = https.filesystem(options, url)
            handed: list[int] = []
            with pytest.raises(TransferError, match="answered a byte range with the whole") as e:
                https.read_range(fs, url, 1 << 20, 2 << 20, lambda at, data, h=handed: h.append(at))
            assert not e.value.permanent and handed == [], methods


def test_a_server_that_sends_more_than_was_asked_for_is_refused(
    stores_env: dict[str, str], tmp_path: Path
) -> None:
    """A server the user points at may answer a byte range with more bytes than the range,
    or a small file's GET with far more than its size said: nothing past the range is handed
    on, the small file's body is not gathered past its planned size (1 KiB said, 64 MiB
    sent; the server cannot send it all), and both fail as transient errors, through the
    worker's own client and, for a redirected read, through fsspec's. Through the mover, the
    job's file is not written."""
    from bbstage import movers

    extra = 64 << 20
    sent: list[int] = []  # the bytes of each body the server got out before the client left

    def do_HEAD(self: Any) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "1024")
        self.end_headers()

    def do_GET(self: Any) -> None:  # noqa: N802
        if self.path.startswith("/moved"):
            self.send_response(302)
            self.send_header("Location", self.path.removeprefix("/moved"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        wanted = self.headers.get("Range")
        self.send_response(206 if wanted else 200)
        if wanted:
            first, last = (int(x) for x in wanted.removeprefix("bytes=").split("-"))
            self.send_header("Content-Range", f"bytes {first}-{last}/{1 << 30}")
        self.send_header("Content-Length", str(extra))
        self.end_headers()
        out = 0
        try:
            for _ in range(extra >> 20):
                self.wfile.write(b"x" * (1 << 20))
                out += 1 << 20
        except OSError:
            pass  # the client stopped reading, as it should
        sent.append(out)

    (tmp_path / "www").mkdir()
    with _tls_server(stores_env, tmp_path / "www", do_GET=do_GET, do_HEAD=do_HEAD) as port:
        https = movers.backend("https")
        options = StoreOptions(
            {"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"], "allowed_hosts": [f"127.0.0.1:{port}"]}
        )
        fs = https.filesystem(options, f"https://127.0.0.1:{port}/")
        for path in ("/lie", "/moved/lie"):  # the worker's client; fsspec's, after a redirect
            url = f"https://127.0.0.1:{port}{path}"
            handed: list[tuple[int, int]] = []
            into = lambda at, d, handed=handed: handed.append((at, len(d)))  # noqa: E731
            with pytest.raises(TransferError, match="sent more than the 1048576 bytes") as e:
                https.read_range(fs, url, 1 << 20, 2 << 20, into)
            assert not e.value.permanent
            assert all(1 << 20 <= at and at + n <= 2 << 20 for at, n in handed), handed
            with pytest.raises(TransferError, match="sent more than the 1024 bytes") as e:
                https.read(fs, url, 1024)
            assert not e.value.permanent
        store = Store("https", f"https://127.0.0.1:{port}", options, None)
        events = BackendSuite().run(store, f"https://127.0.0.1:{port}/lie", str(tmp_path / "x"))
        assert isinstance(events[-1], Failed) and "sent more than" in events[-1].message
        assert not (tmp_path / "x").exists()
    # no body was read to its end (a socket's buffers hold a few MiB, not 64)
    assert sent and max(sent) < extra, sent


@pytest.mark.parametrize(
    "said",
    [
        ("200", "Content-Length", "5" * 5000),
        ("200", "Content-Length", "+1234"),
        ("200", "Content-Length", "1234", "Content-Length", "1234"),
        ("200", "Content-Length", "\u00b2"),
        ("200",),
        ("200", "Content-Encoding", "gzip", "Content-Length", "1234"),
        ("206", "Content-Range", "bytes 10-1233/1234", "Content-Length", "1234"),
        ("206", "Content-Range", "bytes 0-1233/1000", "Content-Length", "1234"),
        ("206", "Content-Range", "bytes 0-1233/*", "Content-Length", "1234"),
        ("206", "Content-Length", "1234"),
    ],
    ids=[
        "long",
        "sign",
        "two",
        "superscript",
        "none",
        "coded",
        "elsewhere",
        "past-its-end",
        "no-size",
        "no-range",
    ],  # fmt: skip
)
def test_a_size_the_first_bytes_reply_does_not_say_plainly_is_asked_by_fsspec(
    stores_env: dict[str, str], tmp_path: Path, said: tuple[str, ...]
) -> None:
    """A size is asked by a GET of the file's first bytes; a reply whose ``Content-Length``
    is not plain digits (5,000 of them, a sign, two headers, a superscript digit, none), or
    whose body is encoded, or whose ``Content-Range`` is not the bytes from 0 of a file that
    has them (bytes from 10; a file smaller than its bytes; no size; none) is not believed:
    the size is asked again through fsspec's client (a HEAD), and the bytes that came are
    not kept: the file is read again, and its bytes are the file's."""
    from bbstage import movers
    from bbstage.movers.implementations import httpget

    real = b"x" * 1234

    def do_GET(self: Any) -> None:  # noqa: N802 - http.server's name
        if self.headers.get("Range") != f"bytes=0-{httpget.PROBE - 1}":
            return type(self).__mro__[1].do_GET(self)  # fsspec's and the read's: the file
        self.send_response(int(said[0]))
        for name, value in zip(said[1::2], said[2::2], strict=True):
            self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"y" * 1234)  # not the file's bytes

    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "f").write_bytes(real)
    with _tls_server(stores_env, tmp_path / "www", do_GET=do_GET) as port:
        https = movers.backend("https")
        url = f"https://127.0.0.1:{port}/f"
        fs = _allowed(stores_env, port, url)
        assert fs.blocking.size(str(fs.encode_url(url)), url) is None
        assert https.info(fs, url)["size"] == 1234
        https.prefetch(fs, url, 1234)
        assert https.read(fs, url, 1234) == real


def test_a_small_file_comes_with_its_size_and_a_bigger_ones_rest_must_be_its_range(
    stores_env: dict[str, str], tmp_path: Path
) -> None:
    """Through nginx: a file of up to ``PROBE`` bytes is read in the one request that asks
    its size (its size and its bytes), a bigger one in two, the second for the rest alone
    (bytes from ``PROBE``); the bytes are the files'. A server that answers the rest with a
    200 (the whole file, cut to the rest's length) is refused, transiently, the bytes
    that came not joined."""
    from bbstage import movers
    from bbstage.movers.implementations import httpget

    https = movers.backend("https")
    gen = open_store(
        "https", stores_env, StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]})
    )
    store = next(gen)
    asked: list[str | None] = []
    start = httpget._Request.start

    def counted(self: httpget._Request, curl: Any) -> None:
        asked.append(None if self.start_at is None else f"{self.start_at}+{self.most}")
        start(self, curl)

    try:
        small, bigger = os.urandom(1000), os.urandom(httpget.PROBE + 1000)
        store.put("small", small)
        store.put("bigger", bigger)
        fs = https.filesystem(store.options, store.url(""))
        paths = [store.url("small"), store.url("bigger")]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(httpget._Request, "start", counted)
            sizes = [info["size"] for info in https.infos(fs, paths)]
            for path, size in zip(paths, sizes, strict=True):
                https.prefetch(fs, path, size)
            assert [https.read(fs, p, n) for p, n in zip(paths, sizes, strict=True)] == [
                small,
                bigger,
            ]
        assert sizes == [1000, httpget.PROBE + 1000]
        probe = f"0+{httpget.PROBE}"
        assert asked == [probe, probe, f"{httpget.PROBE}+1000"], asked
    finally:
        next(gen, None)

    def do_GET(self: Any) -> None:  # noqa: N802 - http.server's name
        wanted = self.headers.get("Range", "")
        if wanted == f"bytes=0-{httpget.PROBE - 1}":
            body = bigger[: httpget.PROBE]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes 0-{httpget.PROBE - 1}/{len(bigger)}")
            self.send_header("ETag", '"v1"')
        else:  # the rest, answered with the whole file's first bytes
            body = bigger[:1000]
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    with _served(stores_env, tmp_path, "/bigger", do_GET=do_GET) as (url, fs):
        assert https.info(fs, url)["size"] == len(bigger)
        https.prefetch(fs, url, len(bigger))
        with pytest.raises(TransferError, match="changed while it was read") as e:
            https.read(fs, url, len(bigger))
        assert not e.value.permanent


def test_the_rest_of_a_file_is_read_only_from_the_version_its_first_bytes_came_from(
    stores_env: dict[str, str], tmp_path: Path
) -> None:
    """A file's first bytes come with its size; the rest is asked later, with ``If-Range``
    (nginx's ETag): a file changed in between (same size, new bytes) is answered whole, and
    refused, transiently, never joined to the old first bytes; the next read has the new
    file whole. A server that names no version (no ETag, no Last-Modified) has its first
    bytes dropped, and the file is read whole, in one GET."""
    from bbstage import movers
    from bbstage.movers.implementations import httpget

    https = movers.backend("https")
    gen = open_store(
        "https", stores_env, StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]})
    )
    store = next(gen)
    try:
        old, new = os.urandom(httpget.PROBE + 1000), os.urandom(httpget.PROBE + 1000)
        store.put("v", old)
        fs = https.filesystem(store.options, store.url(""))
        url = store.url("v")
        assert https.info(fs, url)["size"] == len(old)
        assert store.local_root is not None
        (store.local_root / "v").write_bytes(new)
        later = time.time() + 10  # a new ETag (nginx's: the time and the size)
        os.utime(store.local_root / "v", (later, later))
        https.prefetch(fs, url, len(new))
        with pytest.raises(TransferError, match="changed while it was read") as e:
            https.read(fs, url, len(new))
        assert not e.value.permanent
        assert https.read(fs, url, len(new)) == new
    finally:
        next(gen, None)

    seen: list[str | None] = []
    body = os.urandom(httpget.PROBE + 1000)

    def do_GET(self: Any) -> None:  # noqa: N802 - http.server's name
        wanted = self.headers.get("Range")
        seen.append(wanted)
        first, last = (0, len(body) - 1)
        if wanted:
            first, last = (int(x) for x in wanted.removeprefix("bytes=").split("-"))
            last = min(last, len(body) - 1)
        self.send_response(206 if wanted else 200)
        if wanted:
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(body)}")
        self.send_header("Content-Length", str(last + 1 - first))
        self.end_headers()
        self.wfile.write(body[first : last + 1])

    with _served(stores_env, tmp_path, "/f", do_GET=do_GET) as (url, fs):
        assert https.info(fs, url)["size"] == len(body)
        https.prefetch(fs, url, len(body))
        assert https.read(fs, url, len(body)) == body
    assert seen == [f"bytes=0-{httpget.PROBE - 1}", None], seen


def test_the_first_bytes_of_files_never_read_are_not_all_kept(
    stores_env: dict[str, str],
) -> None:
    """A tree's sizes bring its small files' bytes; the files a resumed transfer finds in
    place are never read: no more than ``KEPT`` files' first bytes are kept (a tree of a
    million small files in place holds 4 MiB, not the tree), and a file whose bytes were
    dropped is read again, whole."""
    from bbstage import movers
    from bbstage.movers.implementations import httpget

    https = movers.backend("https")
    options = StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]})
    gen = open_store("https", stores_env, options)
    store = next(gen)
    try:
        files = {f"k/f{i:03d}": os.urandom(100 + i) for i in range(httpget.KEPT + 40)}
        for name, data in files.items():
            store.put(name, data)
        fs = https.filesystem(store.options, store.url(""))
        paths = [store.url(name) for name in files]
        sizes = [info["size"] for info in https.infos(fs, paths)]
        assert sizes == [len(data) for data in files.values()]
        assert len(fs.blocking._kept) <= httpget.KEPT
        assert https.read(fs, paths[0], sizes[0]) == files["k/f000"]
    finally:
        next(gen, None)


def test_a_shard_of_an_https_tree_asks_the_sizes_of_its_own_files_alone(
    stores_env: dict[str, str], tmp_path: Path
) -> None:
    """A tree split across transfer nodes (``TreeShard``): each shard asks the size of its
    own files only (an HTTPS size's request brings a small file's bytes: every shard asking
    every file would read the tree once per node); together the shards stage every file,
    bytes checked."""
    from bbstage.movers.implementations import httpget
    from bbstage.transfer import TreeShard

    gen = open_store(
        "https", stores_env, StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]})
    )
    store = next(gen)
    asked: list[str] = []
    start = httpget._Request.start

    def counted(self: httpget._Request, curl: Any) -> None:
        if self.head is not None:
            asked.append(self.url)
        start(self, curl)

    try:
        files = {f"s/d{i % 3}/f{i:02d}": os.urandom(500 + i) for i in range(30)}
        for name, data in files.items():
            store.put(name, data)
        suite = BackendSuite()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(httpget._Request, "start", counted)
            for index in (0, 1):
                events = suite.run(
                    store, store.url("s/"), str(tmp_path / "s") + "/", part=TreeShard(index, 2)
                )
                assert isinstance(events[-1], Done), events[-1]
        assert all((tmp_path / name).read_bytes() == data for name, data in files.items())
        assert len(asked) == len(set(asked)) == len(files), sorted(asked)
    finally:
        next(gen, None)


def test_https_reads_are_made_on_kept_connections_and_a_redirect_is_followed_checked(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTPS files are read by libcurl (``httpget.BlockingClient``) on kept connections:
    12 ranges by 4 threads open no more than 4 (and the request of its size one); 40 small
    files, their sizes asked and the files read up to 16 at once, no more than 16, and
    fsspec's client none; the bytes are the files'; a connection the server closed while it
    was kept is opened again. A range, a file or a size the server redirects is asked
    through fsspec's client, which follows the redirect to an allowed host, and refuses one
    to a host the site has not allowed (a listener there sees no connection)."""
    import pycurl
    from fsspec.implementations import http as fsspec_http

    from bbstage import movers
    from bbstage.movers.implementations import httpget

    https = movers.backend("https")
    monkeypatch.setattr(https, "ranges", (1 << 20, 4))
    opened: list[object] = []  # the sockets libcurl opened
    handle = httpget.BlockingClient._handle

    def counted(self: httpget.BlockingClient, *args: Any) -> Any:
        curl = handle(self, *args)

        def opensocket(purpose: int, address: Any) -> socket.socket:
            opened.append(address)
            return socket.socket(address.family, address.socktype, address.protocol)

        curl.setopt(pycurl.OPENSOCKETFUNCTION, opensocket)
        return curl

    monkeypatch.setattr(httpget.BlockingClient, "_handle", counted)
    looped: list[str] = []  # what fsspec's own client asked
    file_info = fsspec_http._file_info

    async def counted_info(url: str, *args: Any, **kwargs: Any) -> Any:
        looped.append(url)
        return await file_info(url, *args, **kwargs)

    monkeypatch.setattr(fsspec_http, "_file_info", counted_info)
    gen = open_store(
        "https", stores_env, StoreOptions({"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]})
    )
    store = next(gen)
    try:
        body = os.urandom((12 << 20) - 1)
        store.put("big", body)
        suite = BackendSuite()
        assert isinstance(suite.run(store, store.url("big"), str(tmp_path / "big"))[-1], Done)
        assert (tmp_path / "big").read_bytes() == body
        assert 1 <= len(opened) <= 4 + 1, opened  # the ranges', and the size's
        small = {f"t/f{i:02d}": os.urandom(1000 + i) for i in range(40)}
        for name, data in small.items():
            store.put(name, data)
        opened.clear()
        looped.clear()
        events = suite.run(store, store.url("t/"), str(tmp_path / "t") + "/", threads=8)
        assert isinstance(events[-1], Done) and events[-1].files == 40, events[-1]
        assert all((tmp_path / k).read_bytes() == v for k, v in small.items())
        assert 1 <= len(opened) <= 16, len(opened)
        assert not [u for u in looped if "/t/f" in str(u)], looped
        (tmp_path / "www").mkdir()
        (tmp_path / "www" / "f").write_bytes(b"kept")
        with _tls_server(stores_env, tmp_path / "www", timeout=0.2) as port:  # idle: closed
            settings = {**store.options.settings, "allowed_hosts": [f"127.0.0.1:{port}"]}
            url = f"https://127.0.0.1:{port}/f"
            fs = https.filesystem(StoreOptions(settings), url)
            opened.clear()
            assert https.read(fs, url, 4) == b"kept"
            time.sleep(0.6)  # the server closes the connection kept: the next read opens one
            assert https.read(fs, url, 4) == b"kept"
            assert len(opened) == 2, len(opened)

        with _listener("127.0.0.1") as (away, seen):
            moves = {
                "/moved": store.url("big"),
                "/moved-small": store.url("t/f01"),
                "/away": f"https://127.0.0.1:{away}/big",
            }

            def do_GET(self: Any) -> None:  # noqa: N802 - http.server's name
                self.send_response(302)
                self.send_header("Location", moves[self.path])
                self.send_header("Content-Length", "0")
                self.end_headers()

            with _tls_server(stores_env, tmp_path, do_GET=do_GET) as port:
                allowed = [*store.options.settings["allowed_hosts"], f"127.0.0.1:{port}"]
                options = StoreOptions({**store.options.settings, "allowed_hosts": allowed})
                fs = https.filesystem(options, f"https://127.0.0.1:{port}/")
                got = bytearray(2 << 20)

                def into(at: int, data: bytes | memoryview) -> None:
                    got[at - (1 << 20) : at - (1 << 20) + len(data)] = data

                url = f"https://127.0.0.1:{port}/moved"
                assert https.read_range(fs, url, 1 << 20, 3 << 20, into) == 2 << 20
                assert bytes(got) == body[1 << 20 : 3 << 20]
                small_size = len(small["t/f01"])
                assert (
                    https.read(fs, f"https://127.0.0.1:{port}/moved-small", small_size)
                    == small["t/f01"]
                )
                # the size's request redirected: asked again by fsspec's client, which follows
                looped.clear()
                moved_small = f"https://127.0.0.1:{port}/moved-small"
                assert https.info(fs, moved_small)["size"] == small_size
                assert looped, "the size of a redirected file was not asked again"
                away_url = f"https://127.0.0.1:{port}/away"
                with pytest.raises(TransferError, match=r"\[https\] allowed_hosts"):
                    https.read_range(fs, away_url, 0, 10, into)
                with pytest.raises(TransferError, match=r"\[https\] allowed_hosts"):
                    https.read(fs, away_url, 10)
                with pytest.raises(FileNotFoundError):  # fsspec's info: any failure
                    https.info(fs, away_url)
        assert not seen, "a redirect reached a host the site did not allow"
    finally:
        next(gen, None)


def _allowed(env: dict[str, str], port: int, url: str) -> Any:
    """The https filesystem of ``url``, on a test server at ``port`` that the site allows."""
    from bbstage import movers

    options = StoreOptions(
        {"ca_bundle": env["BBSTAGE_HTTPS_CA"], "allowed_hosts": [f"127.0.0.1:{port}"]}
    )
    return movers.backend("https").filesystem(options, url)


@contextlib.contextmanager
def _served(env: dict[str, str], tmp_path: Path, path: str, **methods: Any) -> Iterator[Any]:
    """``_tls_server`` with ``methods``, serving an empty directory; the URL of ``path``
    there and its https filesystem, the server allowed."""
    (tmp_path / "www").mkdir()
    with _tls_server(env, tmp_path / "www", **methods) as port:
        url = f"https://127.0.0.1:{port}{path}"
        yield url, _allowed(env, port, url)


@contextlib.contextmanager
def _tls_server(env: dict[str, str], root: Path, **methods: Any) -> Iterator[int]:
    """Python's own HTTPS server (HTTP/1.1, ``Range`` ignored) on 127.0.0.1 with the test
    CA's certificate, serving ``root``, its handler given ``methods``; its port."""
    import http.server
    import ssl

    ca = Path(env["BBSTAGE_HTTPS_CA"]).parent
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ca / "server.pem", ca / "server.key")
    handler = type(
        "Plain",
        (http.server.SimpleHTTPRequestHandler,),
        {"log_message": lambda *a: None, "protocol_version": "HTTP/1.1", **methods},
    )
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root))
    )
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("kind", ["https", "az", "sftp"])
def test_each_range_of_a_big_file_is_read_only_from_the_version_it_was_listed_in(
    kind: str, stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file listed (``find``, as a tree is; ``info``, as one file is, and each file of an
    HTTPS tree: its listing names no size) is read in ranges, each checked against the
    version listed (HTTPS: ``If-Range`` the ETag its size's reply named; Azure:
    ``If-Match`` its ETag; SFTP: the open file's size and modification time after the
    range) and its size: a file replaced after it was listed is refused, transiently, never
    staged of two versions. The next try (the plan kept: nothing listed again) reads the
    version it has now: a file replaced, its size kept, is read whole and new; one that
    grew is refused for its size, never staged cut at the size planned."""
    from bbstage import movers

    user_home(tmp_path, monkeypatch)
    ca = {"ca_bundle": stores_env["BBSTAGE_HTTPS_CA"]} if kind == "https" else {}
    gen = open_store(kind, stores_env, StoreOptions(ca))
    store = next(gen)
    backend = movers.backend(kind)
    size = 3 << 16
    got = bytearray(size)

    def into(at: int, data: bytes) -> None:
        got[at : at + len(data)] = data

    def replace(path: str, data: bytes) -> None:
        if kind == "az":  # a new ETag
            store.put(f"t/{name}", data)
            return
        # the server's file, on this machine; a later modification time (nginx's ETag: the
        # time and the size)
        local = store.local_root / f"t/{name}" if store.local_root is not None else Path(path)
        local.write_bytes(data)
        later = time.time() + 10
        os.utime(local, (later, later))

    try:
        for how, name, new in (
            ("find" if kind != "https" else "info", "same", os.urandom(size)),
            ("info", "grown", os.urandom(size + 1)),
        ):
            store.put(f"t/{name}", os.urandom(size))
            fs = backend.filesystem(store.options, store.url(""))
            path = backend.strip(store.url(f"t/{name}"))
            if how == "find":
                found = backend.find(fs, backend.strip(store.url("t")).rstrip("/"))
                assert found[path]["size"] == size
            else:
                assert backend.info(fs, path)["size"] == size
            assert backend.read_range(fs, path, 0, size // 2, into) == size // 2
            replace(path, new)
            with pytest.raises(TransferError, match="changed while it was read") as e:
                backend.read_range(fs, path, size // 2, size, into)
            assert not e.value.permanent
            if len(new) == size:  # the next try
                assert backend.read_range(fs, path, 0, size, into) == size
                assert bytes(got) == new
            else:
                with pytest.raises(TransferError, match=f"has {size + 1} bytes, planned {size}"):
                    backend.read_range(fs, path, 0, size, into)
            backend.close(fs)
    finally:
        next(gen, None)


def test_azure_reads_are_signed_for_one_blob_alone_and_the_signature_is_never_named(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Azure blobs are read by plain GETs (``read``, ``read_range``) signed for one blob: the
    signature lets its holder read that blob alone, for at most an hour, and write nothing.
    A URL with a signature is a credential: the errors name the blob, never the URL (the
    server refuses a wrong key, a blob is missing). A connection string that holds a
    signature of its own (no key) is read with that signature."""
    import datetime
    import urllib.error
    import urllib.parse
    import urllib.request

    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    from bbstage import movers
    from bbstage.movers.implementations import azure

    home = user_home(tmp_path, monkeypatch)
    secret = home / ".config/bbstage/azure-connection-string"
    gen = open_store("az", stores_env, StoreOptions({}))
    store = next(gen)
    az = movers.backend("az")
    try:
        store.put("a", b"A" * 1000)
        store.put("b", b"B")
        fs = az.filesystem(store.options, store.url("a"))
        a = az.strip(store.url("a"))
        got: list[tuple[int, bytes]] = []
        assert az.read(fs, a, 1000) == b"A" * 1000
        assert az.read_range(fs, a, 10, 20, lambda at, data: got.append((at, data))) == 10
        assert got == [(10, b"A" * 10)]

        signed = azure._signed(fs, *fs.split_path(a)[:2])
        assert signed is not None
        with urllib.request.urlopen(signed) as reply:
            assert reply.read() == b"A" * 1000
        where, query = signed.split("?", 1)
        expiry = datetime.datetime.fromisoformat(urllib.parse.parse_qs(query)["se"][0])
        assert expiry <= datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        refused = [
            urllib.request.Request(where[: -len("a")] + "b?" + query),  # another blob
            urllib.request.Request(
                signed, b"x", {"x-ms-blob-type": "BlockBlob"}, method="PUT"
            ),  # a write
        ]
        for request in refused:
            with pytest.raises(urllib.error.HTTPError) as http:
                urllib.request.urlopen(request)
            assert http.value.code == 403, request.full_url
        assert fs.cat_file(a) == b"A" * 1000

        sig = urllib.parse.parse_qs(query)["sig"][0]
        connection = stores_env["BBSTAGE_AZ_CONNECTION"]
        account = azure_account(connection)
        key = account["AccountKey"]
        wrong_key = connection.replace(key, "d3Jvbmc=" + key[8:])
        for read in (
            lambda f, path: az.read(f, path, 5),
            lambda f, path: az.read_range(f, path, 0, 5, lambda at, data: None),
        ):
            with pytest.raises(FileNotFoundError) as missing:
                read(fs, a + "-gone")
            assert "sig=" not in str(missing.value) and a + "-gone" in str(missing.value)
            secret.write_text(wrong_key)
            with pytest.raises(PermissionError) as wrong:
                read(az.filesystem(store.options, store.url("a")), a)
            text = str(wrong.value)
            assert "sig=" not in text and sig not in text and a in text, text
            secret.write_text(connection)

        own = generate_account_sas(
            account["AccountName"],
            account["AccountKey"],
            ResourceTypes(object=True),
            AccountSasPermissions(read=True),
            datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=10),
        )
        secret.write_text(f"BlobEndpoint={account['BlobEndpoint']};SharedAccessSignature={own}")
        fs = az.filesystem(store.options, store.url("a"))
        assert az.read(fs, a, 1000) == b"A" * 1000
    finally:
        secret.write_text(stores_env["BBSTAGE_AZ_CONNECTION"])
        next(gen, None)


def test_an_azure_listing_is_signed_to_list_one_container_and_is_adlfss_own(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree is listed by plain GETs (``AzureBackend.find``) signed to list that container
    alone: the signature reads no blob and lists no other container, expires within an hour,
    and no error names it. What it finds is what adlfs's ``find`` (the SDK) finds for the
    same tree, page after page (here 2 blobs a page): odd names, empty blobs, a blob marked
    a directory (``hdi_isfolder``, as Data Lake and adlfs write them), the directories
    between. A copy of the tree makes the marked directory and every file, bytes checked."""
    import datetime
    import urllib.error
    import urllib.parse
    import urllib.request

    from azure.storage.blob import BlobServiceClient

    from bbstage import movers
    from bbstage.movers.backends import Backend
    from bbstage.movers.implementations import azure
    from bbstage.movers.implementations.generic.side import mtime_ns

    user_home(tmp_path, monkeypatch)
    gen = open_store("az", stores_env, StoreOptions({}))
    store = next(gen)
    az = movers.backend("az")
    try:
        bodies = {f"t/{ODD}": b"odd", "t/a": b"A" * 70_000, "t/sub/deeper/b": b"B",
                  "t/sub/empty": b"", "t/été/c": b"C", "u/not listed": b"U"}  # fmt: skip
        for name, body in bodies.items():
            store.put(name, body)
        top = az.strip(store.root)  # container/prefix/
        root, (container, prefix) = top + "t", top.split("/", 1)
        service = BlobServiceClient.from_connection_string(stores_env["BBSTAGE_AZ_CONNECTION"])
        service.get_blob_client(container, prefix + "t/marked").upload_blob(
            b"", metadata={"hdi_isfolder": "true"}
        )
        fs = az.filesystem(store.options, store.url("t"))
        monkeypatch.setattr(azure, "LIST_PAGE", 2)
        found = az.find(fs, root)

        def seen(listing: dict[str, dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
            """What the mover takes from a listing: each path's type, a file's size and time."""
            return {
                path: (info["type"], info["size"], mtime_ns(info))
                if info["type"] == "file"
                else ("directory",)
                for path, info in listing.items()
            }

        assert seen(found) == seen(Backend.find.__func__(az, fs, root))  # type: ignore[attr-defined]
        assert found[root + "/marked"]["type"] == "directory"
        assert {p for p, i in found.items() if i["type"] == "file"} == {
            top + name for name in bodies if name.startswith("t/")
        }

        signed = azure._signed(fs, container, None)
        assert signed is not None
        where, query = signed.split("?", 1)
        expiry = datetime.datetime.fromisoformat(urllib.parse.parse_qs(query)["se"][0])
        assert expiry <= datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        with urllib.request.urlopen(signed + "&restype=container&comp=list") as reply:
            assert reply.status == 200
        for refused in (
            f"{where}/{urllib.parse.quote(prefix)}t/a?{query}",  # a blob's bytes
            f"{where}-other?{query}&restype=container&comp=list",  # another container
        ):
            with pytest.raises(urllib.error.HTTPError) as http:
                urllib.request.urlopen(refused)
            assert http.value.code == 403, refused

        with pytest.raises(FileNotFoundError) as missing:
            az.find(fs, "bbstage-none-such/x")
        assert "sig=" not in str(missing.value) and "bbstage-none-such" in str(missing.value)

        out = tmp_path / "out"
        events = BackendSuite().run(store, store.url("t/"), f"{out}/")
        assert isinstance(events[-1], Done), events[-1]
        got = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        assert got == {name[2:]: body for name, body in bodies.items() if name.startswith("t/")}
        assert (out / "marked").is_dir()
    finally:
        next(gen, None)


def test_an_azure_read_goes_through_the_proxy_of_the_workers_environment(
    stores_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site whose transfer nodes reach Azure through a proxy (``HTTP_PROXY`` and the like,
    in the worker's environment: ``AzureBackend.env``) has the signed GETs sent through it,
    as the SDK's own requests are: here the proxy is a listener that closes each
    connection, so the read fails, having reached it and not Azurite."""
    from bbstage import movers

    user_home(tmp_path, monkeypatch)
    gen = open_store("az", stores_env, StoreOptions({}))
    store = next(gen)
    az = movers.backend("az")
    try:
        store.put("a", b"through the proxy")
        path = az.strip(store.url("a"))
        with _listener("127.0.0.1") as (port, seen):
            for name in ("HTTP_PROXY", "HTTPS_PROXY"):
                monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
            fs = az.filesystem(store.options, store.url("a"))
            with pytest.raises(TransferError) as failed:
                az.read(fs, path, 1)
            assert seen, "the read did not go through the proxy"
            assert "sig=" not in str(failed.value)
        for name in ("HTTP_PROXY", "HTTPS_PROXY"):
            monkeypatch.delenv(name)
        assert (
            az.read(az.filesystem(store.options, store.url("a")), path, 17) == b"through the proxy"
        )
    finally:
        next(gen, None)
