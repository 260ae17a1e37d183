"""A worker SIGKILLed in the middle of a transfer to or from a generic store, then the
transfer run again (resumed, as the engine runs it after a lost worker): every file lands
with its bytes (sha256), and no temporary file is left, on the local disk or on the store
(SFTP takes uploads under a temporary name, renamed into place: a killed worker's are swept
by the next attempt, as a local disk's are). Each against its server of
scripts/local-stores; the worker is a child process, killed as the OOM killer would."""

from __future__ import annotations

import hashlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bbstage.movers.implementations.fsstore import StoreOptions
from bbstage.transfer import Done, TransferSpec, worker
from tests.backends.stores import REPO, Store, open_store, stores_env, user_home
from tests.helpers import Conn

__all__ = ["stores_env"]

BIG, BIGS, SMALL, SMALLS = 12 << 20, 6, 64 << 10, 40
CHILD = """
import pickle, sys, threading
from bbstage.transfer import worker
from tests.helpers import Conn
with open(sys.argv[1], "rb") as f:
    spec = pickle.load(f)
worker.transfer(spec, worker.Reporter(Conn()), threading.Event())
"""


def _options(kind: str, env: dict[str, str]) -> StoreOptions:
    return StoreOptions({"ca_bundle": env["BBSTAGE_HTTPS_CA"]} if kind == "https" else {})


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return user_home(tmp_path, monkeypatch)  # the user's SSH key, known_hosts, Azure string


def _tree() -> dict[str, bytes]:
    files = {f"big/b{i}": os.urandom(BIG) for i in range(BIGS)}
    files.update({f"small/d{i % 4}/s{i}": os.urandom(SMALL) for i in range(SMALLS)})
    return files


def _digests(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(body).hexdigest() for name, body in files.items()}


def _killed_mid_copy(spec: TransferSpec, tmp_path: Path, temps: Callable[[], list[str]]) -> None:
    """Run ``spec`` in a child worker; SIGKILL it while ``temps()`` shows a temporary file
    (held with SIGSTOP while it is looked at again: a file can land in between)."""
    with open(tmp_path / "spec.pickle", "wb") as f:
        pickle.dump(spec, f)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "spec.pickle")],
                             cwd=REPO, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert child.poll() is None, "the transfer ended before a temporary file was seen"
            if temps():
                child.send_signal(signal.SIGSTOP)
                if temps():
                    break
                child.send_signal(signal.SIGCONT)
            time.sleep(0.002)
        else:
            raise AssertionError("no temporary file within 120 s")
    finally:
        child.kill()
        child.wait(20)


def _resumed(spec: TransferSpec) -> None:
    conn = Conn()
    worker.transfer(spec.but(resumed=True), worker.Reporter(conn), threading.Event())  # type: ignore[arg-type]
    assert isinstance(conn.events[-1], Done), conn.events[-1]


def _upload(files: dict[str, bytes], src: Path, store: Store) -> TransferSpec:
    """``files`` written under ``src``, and the spec of their upload to ``store``'s up/."""
    for name, body in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(body)
    return TransferSpec.between(f"{src}/", store.url("up/"), job_id="killed",
                                destination_options=store.options)  # fmt: skip


@pytest.fixture
def store(kind: str, stores_env: dict[str, str], home: Path) -> Iterator[Store]:
    """The test's ``kind`` of store, on its local server, under a fresh prefix."""
    yield from open_store(kind, stores_env, _options(kind, stores_env))


@pytest.mark.parametrize("kind", ["https", "sftp", "az"])
def test_a_download_whose_worker_is_killed_is_resumed_whole(
    kind: str, store: Store, tmp_path: Path
) -> None:
    files = _tree()
    for name, body in files.items():
        store.put(name, body)
    dst = tmp_path / "dst"
    spec = TransferSpec.between(store.url(""), f"{dst}/", job_id="killed",
                                source_options=store.options)  # fmt: skip

    def temps() -> list[str]:
        return [p.name for p in dst.rglob(".*.part")] if dst.exists() else []

    _killed_mid_copy(spec, tmp_path, temps)
    assert temps(), "the kill left no temporary file"
    _resumed(spec)
    got = {str(p.relative_to(dst)): p.read_bytes() for p in dst.rglob("*") if p.is_file()}
    assert _digests(got) == _digests(files)  # no temporary file among them either


@pytest.mark.parametrize("kind", ["sftp", "az"])
def test_an_upload_whose_worker_is_killed_is_resumed_whole_and_leaves_no_temporary_file(
    kind: str, store: Store, tmp_path: Path
) -> None:
    files = _tree()
    spec = _upload(files, tmp_path / "src", store)

    def temps() -> list[str]:  # SFTP's temporary names; Azure commits a blob whole
        names = store.names()
        if kind == "az":  # caught once some blobs landed, not all
            return names if 0 < len(names) < len(files) else []
        return [n for n in names if n.endswith(".part")]

    _killed_mid_copy(spec, tmp_path, temps)
    assert temps(), "the kill left no temporary file"
    _resumed(spec)
    assert sorted(store.names()) == sorted(f"up/{name}" for name in files)
    got = {name: store.get(f"up/{name}") or b"" for name in files}
    assert _digests(got) == _digests(files)


@pytest.mark.parametrize("kind", ["sftp"])
def test_a_resumed_upload_into_directories_not_made_yet_sweeps_nothing_and_lands(
    kind: str, store: Store, tmp_path: Path
) -> None:
    """An attempt killed before it made the destination's directories: the next one's sweep
    finds no directory to look in, which is no error, and every file lands."""
    files = {"a/b/one": os.urandom(1000), "c/two": os.urandom(SMALL)}
    spec = _upload(files, tmp_path / "src", store)
    _resumed(spec)
    got = {name: store.get(f"up/{name}") or b"" for name in files}
    assert _digests(got) == _digests(files)
