"""The stores of the shared backend suite: each a real server on 127.0.0.1 (S3: Ceph RGW of
scripts/local-s3; the others: scripts/local-stores), seen the same way by the suite
(``Store``: a fresh URL prefix per test, and a way to put and read objects beside bbstage)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bbstage import movers
from bbstage.movers import BackendOptions
from tests.s3env import parse_exports

REPO = Path(__file__).resolve().parents[2]
LOCAL_STORES = REPO / "scripts" / "local-stores"


@pytest.fixture(scope="session")
def stores_env() -> dict[str, str]:
    """``scripts/local-stores up`` once per session: its export lines."""
    proc = subprocess.run(
        [str(LOCAL_STORES), "up"],
        stdout=subprocess.PIPE,
        text=True,
        timeout=1200,
        env={**os.environ, "BBSTAGE_PYTHON": os.environ.get("BBSTAGE_PYTHON", "")},
    )
    assert proc.returncode == 0, "scripts/local-stores up failed (see its output above)"
    return parse_exports(proc.stdout)


@dataclass
class Store:
    """One store as the suite sees it. ``root``: a URL prefix of this test's own (ends in
    /); ``options``: the store side's backend options as the daemon would build them;
    ``fs``: a filesystem on the same store to put and read objects with."""

    kind: str
    root: str
    options: BackendOptions | None
    fs: Any
    read_only: bool = False
    local_root: Path | None = None  # https: where the server's files are
    cleanup: list[Any] = field(default_factory=list)

    def url(self, name: str) -> str:
        if self.kind == "https":  # a URL: its path percent-encoded
            from urllib.parse import quote

            return self.root + quote(name)
        return self.root + name

    def put(self, name: str, data: bytes) -> None:
        if self.local_root is not None:
            path = self.local_root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            return
        path = movers.backend(self.kind).strip(self.url(name))
        self.fs.pipe_file(path, data)

    def get(self, name: str) -> bytes | None:
        """The object's bytes, or None if there is none."""
        if self.local_root is not None:
            path = self.local_root / name
            return path.read_bytes() if path.exists() else None
        path = movers.backend(self.kind).strip(self.url(name))
        try:
            return bytes(self.fs.cat_file(path))
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        """Every object under ``root`` (relative names), temporary ones included."""
        if self.local_root is not None:
            return sorted(
                str(p.relative_to(self.local_root))
                for p in self.local_root.rglob("*")
                if p.is_file()
            )
        top = movers.backend(self.kind).strip(self.root)
        try:
            found = self.fs.find(top.rstrip("/"))
        except FileNotFoundError:
            return []
        return sorted(p[len(top) :] for p in found if p.startswith(top))


def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str = "bbuser1") -> Path:
    """A HOME for the in-process worker holding ``user``'s credentials of the local stores
    (their SSH key and known_hosts, their Azure connection string), as the worker sees them
    in the user's own home."""
    import pwd

    real = Path(pwd.getpwnam(user).pw_dir)
    home = tmp_path / "home"
    for rel in (".ssh/id_ed25519", ".ssh/known_hosts", ".config/bbstage/azure-connection-string"):
        if (real / rel).exists():
            (home / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(real / rel, home / rel)
            (home / rel).chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    return home


def fresh() -> str:
    return f"t-{uuid.uuid4().hex[:12]}/"


def azure_account(connection: str) -> dict[str, str]:
    """A connection string's fields (``AccountName``, ``AccountKey``, ``BlobEndpoint``...)."""
    return dict(p.split("=", 1) for p in connection.strip().strip(";").split(";"))


def allow_local(kind: str, env: dict[str, str], options: BackendOptions | None) -> Any:
    """``options`` with the local server in ``allowed_hosts`` where ``kind``'s URLs name the
    host to reach (https, sftp), in ``allowed_endpoints`` where the user's credentials do
    (az: Azurite), as the local cluster's daemon config has it; unchanged when they name
    their own (or the backend checks no host)."""
    from bbstage.movers.implementations.fsstore import StoreOptions

    if kind in ("az", "abfs") and isinstance(options, StoreOptions):
        if "allowed_endpoints" in options.settings:
            return options
        conn = azure_account(env["BBSTAGE_AZ_CONNECTION"])
        return StoreOptions({**options.settings, "allowed_endpoints": [conn["BlobEndpoint"]]})

    port = {"https": env["BBSTAGE_HTTPS_URL"].rsplit(":", 1)[-1]}.get(kind)
    port = env["BBSTAGE_SFTP_PORT"] if kind == "sftp" else port
    if port is None or not isinstance(options, StoreOptions):
        return options
    if "allowed_hosts" in options.settings:
        return options
    return StoreOptions({**options.settings, "allowed_hosts": [f"127.0.0.1:{port}"]})


def open_store(kind: str, env: dict[str, str], options: BackendOptions | None) -> Iterator[Store]:
    """A ``Store`` on the local server of ``kind`` under a fresh prefix, removed afterwards
    (its options: ``allow_local``'s)."""
    backend = movers.backend(kind)
    options = allow_local(kind, env, options)
    if kind == "https":
        name = fresh()
        local = Path(env["BBSTAGE_HTTPS_ROOT"]) / name
        local.mkdir(parents=True)
        yield Store(kind, env["BBSTAGE_HTTPS_URL"] + "/" + name, options, None, True, local)
        shutil.rmtree(local, ignore_errors=True)
        return
    if kind == "gs":
        root = "gs://bbstage-test/" + fresh()
    elif kind == "az":
        root = "az://bbstage-test/" + fresh()
    elif kind == "sftp":
        user, port = env["BBSTAGE_SFTP_USER"], env["BBSTAGE_SFTP_PORT"]
        import pwd

        root = f"sftp://{user}@127.0.0.1:{port}{pwd.getpwnam(user).pw_dir}/bbstage-test/{fresh()}"
    else:
        raise AssertionError(kind)
    fs = backend.filesystem(options, root)
    if kind == "az" and not fs.exists("bbstage-test"):
        fs.mkdir("bbstage-test")
    store = Store(kind, root, options, fs)
    yield store
    try:
        fs.rm(backend.strip(root).rstrip("/"), recursive=True)
    except (FileNotFoundError, OSError):
        pass
