"""The backends' registry (one class per URL scheme, as fsspec's) and what a backend owns:
a transfer carries only its own two backends' options, and a worker's environment is an
allow-list built from the backends of the transfer at hand."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import pwd
from pathlib import Path

import pytest

from bbstage import movers
from bbstage.config import Config, Pool
from bbstage.daemon.engine import Engine
from bbstage.daemon.state import Store
from bbstage.identity import Identity
from bbstage.movers import Backend, TransferError
from bbstage.movers.implementations.s3 import S3Options
from bbstage.transfer import Done, Planned, transfer_env, worker
from tests.unit.test_engine import GID, UID, FakeExecutor, ask, outcomes, script

NOBODY = Identity(65534, 65534, (65534,))
ROOTS = {
    "AWS_SECRET_ACCESS_KEY": "root-aws",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://127.0.0.1:9/creds",
    "GOOGLE_APPLICATION_CREDENTIALS": "/root/gcp.json",
    "AZURE_STORAGE_CONNECTION_STRING": "AccountKey=root",
    "SOME_SITE_TOKEN": "root-token",
    "HTTPS_PROXY": "http://proxy.site:3128",
}


def test_a_posix_transfer_carries_no_s3_settings_or_secrets(tmp_path: Path) -> None:
    """Only the S3 side of a transfer gets ``[s3]`` and the user's mapped keys; a posix to
    posix spec has no backend options at all (nothing of S3 crosses to its worker)."""
    user = pwd.getpwuid(UID).pw_name
    s3 = {
        "endpoint_url": "http://127.0.0.1:1",
        "accounts": {user: {"access_key": "AK", "secret_key": "SECRET-S"}},
    }
    config = Config(
        socket=tmp_path / "control.sock",
        pools=(Pool("scratch", tmp_path / "scratch", 1 << 30),),
        backend_settings={"s3": s3},
    )
    store = Store(tmp_path / "state.db")
    engine = Engine(config, store, FakeExecutor())
    try:
        lines = ("stage_in source=/a destination=/b", "stage_in source=s3://bkt/k destination=/c")
        fields = {"job_id": "1", "uid": UID, "gid": GID, "script": script(*lines)}
        assert ask(engine, "setup", **fields) == ("ok", "")
        outcomes(engine).extend([(Planned(1, 1), Done(1, 1)), (Planned(1, 1), Done(1, 1))])
        assert ask(engine, "data_in", job_id="1") == ("ok", "")
        posix, s3_spec = engine.executor.specs  # type: ignore[attr-defined]
    finally:
        store.close()
    assert (posix.source_options, posix.destination_options) == (None, None)
    assert b"SECRET-S" not in pickle.dumps(posix) and b"127.0.0.1:1" not in pickle.dumps(posix)
    # The S3 side has them (so the test above would see them if they leaked), the other none.
    assert isinstance(s3_spec.source_options, S3Options)
    assert s3_spec.source_options.credentials == {"key": "AK", "secret": "SECRET-S"}
    assert s3_spec.source_options.s3.accounts == {}  # the typed [s3], without the accounts
    assert s3_spec.destination_options is None


def _worker_env(kinds: list[tuple[str, str]]) -> list[dict[str, str]]:
    """A process that becomes ``NOBODY`` as a worker does, then the environment each
    transfer between ``kinds`` would see."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()

    def probe() -> None:
        worker._become(NOBODY)
        seen = []
        for pair in kinds:
            transfer_env.apply(*pair)
            seen.append(dict(os.environ))
        child.send(seen)

    proc = ctx.Process(target=probe)
    proc.start()
    assert parent.poll(20)
    seen: list[dict[str, str]] = parent.recv()
    proc.join(10)
    return seen


def test_a_workers_environment_is_an_allow_list_by_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """No variable of root's reaches a transfer but those its two backends name: no store's
    credentials (AWS_*, GOOGLE_*, AZURE_*, anything else), the user's HOME; S3 and the
    stores may see the proxy, a posix to posix transfer sees nothing of root's."""
    for name, value in ROOTS.items():
        monkeypatch.setenv(name, value)
    posix, s3, gs, sftp = _worker_env(
        [("posix", "posix"), ("s3", "posix"), ("posix", "gs"), ("sftp", "posix")]
    )
    home = pwd.getpwuid(NOBODY.uid).pw_dir
    for env in (posix, s3, gs, sftp):
        assert env["HOME"] == home
        assert not set(env) & (set(ROOTS) - {"HTTPS_PROXY"}), env
    assert "HTTPS_PROXY" not in posix and "HTTPS_PROXY" not in sftp
    assert s3["HTTPS_PROXY"] == gs["HTTPS_PROXY"] == ROOTS["HTTPS_PROXY"]


def test_registry_lazy_classes_install_hints_and_register() -> None:
    assert movers.backend("scratch") is movers.backend("posix")
    assert movers.get("s3", "posix").__name__ == "S3Download"  # the fast paths, by pair
    assert movers.get("posix", "s3").__name__ == "S3Upload"
    assert movers.get("posix", "posix").__name__ == "PosixMover"
    assert movers.get("s3", "gs").__name__ == "GenericMover"  # store to store
    with pytest.raises(TransferError, match="read-only"):
        movers.get("posix", "https")
    with pytest.raises(TransferError, match=r"unknown \['nfs4'\]"):
        movers.Registry(["nfs4"])

    class Memory(Backend):
        name, schemes = "mem", ("mem",)

    with pytest.raises(ValueError, match="registered already"):
        movers.register_implementation("s3", Memory)
    movers.register_implementation("mem", Memory)
    movers.register_implementation("broken", "no_such_module_here:Backend")
    try:
        assert movers.backend("mem") is Memory
        with pytest.raises(TransferError, match="the broken backend cannot load"):
            movers.backend("broken")
    finally:
        movers._imported.pop("mem", None)
        movers.known_implementations.pop("broken", None)


def test_known_implementations_are_sorted_and_each_loads() -> None:
    assert list(movers.known_implementations) == sorted(movers.known_implementations)
    for kind in movers.known_implementations:
        cls = movers.backend(kind)
        assert kind in cls.schemes or kind == cls.name


def test_an_azure_connection_string_readable_by_others_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's Azure key is in their home; a copy others may read is refused, naming the
    file and the fix (as ssh refuses a private key others can read)."""
    from bbstage.movers.implementations.azure import AZURE_CONNECTION, AzureBackend

    path = tmp_path / AZURE_CONNECTION
    path.parent.mkdir(parents=True)
    path.write_text("AccountName=a;AccountKey=k\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    path.chmod(0o644)
    with pytest.raises(TransferError, match=r"readable by others: chmod 600"):
        AzureBackend.kwargs({}, "az://c/k")
    path.chmod(0o600)
    assert AzureBackend.kwargs({}, "az://c/k") == {
        "connection_string": "AccountName=a;AccountKey=k"
    }


def test_an_azure_listing_page_is_read_as_adlfs_reads_one() -> None:
    """One page of Azure's List Blobs answer, as Azure writes what Azurite does not: a name
    with characters XML cannot hold comes percent-encoded (``Encoded="true"``); a directory
    marker's flag may be capitalized (``Hdi_isfolder``), and adlfs's ``is_directory=false``
    wins over it; the directories between the prefix and a blob are listed once; a page
    that is not XML is refused, naming the listed path."""
    from bbstage.movers.implementations.azure import _listed

    page = b"""<?xml version="1.0" encoding="utf-8"?>
<EnumerationResults ServiceEndpoint="https://a.blob.core.windows.net/" ContainerName="c">
<Prefix>p/</Prefix><Blobs>
<Blob><Name Encoded="true">p/x/bell%07.dat</Name><Properties>
<Last-Modified>Sat, 28 Nov 2026 17:00:00 GMT</Last-Modified>
<Content-Length>7</Content-Length></Properties></Blob>
<Blob><Name>p/x/dir</Name><Properties><Content-Length>0</Content-Length></Properties>
<Metadata><Hdi_isfolder>true</Hdi_isfolder></Metadata></Blob>
<Blob><Name>p/y/file</Name><Properties><Content-Length>3</Content-Length></Properties>
<Metadata><hdi_isfolder>true</hdi_isfolder><is_directory>false</is_directory></Metadata></Blob>
</Blobs><NextMarker>2!next</NextMarker></EnumerationResults>"""
    found: dict[str, dict[str, object]] = {}
    assert _listed(page, "c/p/", found) == "2!next"
    assert {path: info["type"] for path, info in found.items()} == {
        "c/p/x/bell\x07.dat": "file",
        "c/p/x": "directory",
        "c/p/x/dir": "directory",
        "c/p/y/file": "file",
        "c/p/y": "directory",
    }
    assert found["c/p/x/bell\x07.dat"]["size"] == 7
    assert str(found["c/p/x/bell\x07.dat"]["last_modified"]) == "2026-11-28 17:00:00+00:00"
    assert _listed(page.replace(b"<NextMarker>2!next</NextMarker>", b"<NextMarker/>"),
                   "c/p/", {}) == ""  # fmt: skip
    with pytest.raises(TransferError, match=r"^c/p/: the store's listing is not XML"):
        _listed(b"<html>proxy error", "c/p/", {})


def test_backends_section_enables_schemes_and_checks_their_tables(tmp_path: Path) -> None:
    from bbstage import config
    from bbstage.directives import parse

    path = tmp_path / "bbstage.toml"
    path.write_text('[backends]\nenabled = ["gs"]\n[gs]\nendpoint_url = "http://127.0.0.1:1"\n')
    loaded = config.load(path)
    assert loaded.backends == ("gs",) and loaded.backend_settings["gs"].endpoint_url
    ok = "#!/bin/bash\n#BB_LUA stage_in source=gs://bkt/k destination=/x\n"
    assert parse(ok, loaded.registry)["errors"] == []
    path.write_text('[backends]\nenabled = ["gs"]\n[gs]\nendpoint = "x"\n')
    with pytest.raises(
        config.ConfigError,
        match=r"\[gs\] unknown key 'endpoint' \(known: anonymous, endpoint_url, project\)",
    ):
        config.load(path)
    path.write_text("[az]\n")
    with pytest.raises(config.ConfigError, match=r"add the backend to \[backends\] enabled"):
        config.load(path)
    path.write_text('[backends]\nenabled = ["ftp"]\n')
    with pytest.raises(config.ConfigError, match=r"unknown \['ftp'\]"):
        config.load(path)
    default = config.from_dict({}).registry  # a config without [backends]: posix and s3
    assert default.enabled() == movers.Registry.default().enabled() == ["posix", "s3"]
    assert parse(ok, default)["errors"][0]["code"] == "bad-scheme"  # gs:// only where enabled
    assert parse(ok, loaded.registry)["errors"] == []  # the loads after it changed no other
    assert pickle.loads(pickle.dumps(loaded.registry)) == loaded.registry  # a value


@pytest.mark.parametrize(
    ("text", "has"),
    [
        ("processor\t: 0\nflags\t\t: fpu sse2 aes avx2 vaes\n", True),  # x86
        ("processor\t: 0\nFeatures\t: fp asimd aes pmull sha1\n", True),  # Arm
        ("processor\t: 0\nflags\t\t: fpu sse2 vaes avx2\n", False),  # a word, not a part
        ("model name\t: aes\nflags\t\t: fpu\n", False),  # flags only
    ],
)
def test_sftp_asks_for_aes_gcm_first_only_where_the_cpu_has_aes(
    text: str, has: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bbstage.movers.implementations import sftp

    (tmp_path / "cpuinfo").write_text(text)
    assert sftp.cpu_has_aes(str(tmp_path / "cpuinfo")) is has
    assert sftp.cpu_has_aes(str(tmp_path / "nothing")) is False
    monkeypatch.setattr(sftp, "cpu_has_aes", lambda: has)
    algs = sftp.SFTPBackend.kwargs({}, "sftp://u@h/x").get("encryption_algs")
    assert algs == (sftp.AES_FIRST if has else None)
