"""`bbstage health`: each outcome and its exit code, and checks that hang (a FIFO nobody
reads stands in for a hung file system) ended by their deadline. Against a real daemon:
tests/test_ops_daemon.py."""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bbstage import munge
from bbstage.cli import health
from bbstage.config import Config, Pool

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="health's write tests are root's")


@pytest.fixture
def answering(tmp_path: Path) -> Iterator[Path]:
    """A user socket that answers every request as the daemon answers `pools`."""
    path = tmp_path / "user.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                reply = {"status": "ok", "result": {"scratch": {"capacity": 1}}}
                conn.sendall(json.dumps(reply).encode() + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    server.close()


def _config(tmp_path: Path, user_socket: Path, **kw: object) -> Config:
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "pool").mkdir(exist_ok=True)
    pools = (Pool("scratch", tmp_path / "pool", 1 << 30),)
    return Config(state_dir=tmp_path / "state", user_socket=user_socket, pools=pools, **kw)  # type: ignore[arg-type]


def _health(config: Config, timeout: float = 5.0) -> tuple[int, list[str]]:
    state, text = health.report(health.run(health.checks(config, timeout), timeout))
    return state, text.splitlines()


def test_all_ok(tmp_path: Path, answering: Path) -> None:
    state, lines = _health(_config(tmp_path, answering))
    assert state == health.OK == 0
    assert lines[0].startswith("BBSTAGE OK - daemon answering, state and 1 pool(s) writable | ")
    assert "'pool_scratch'=" in lines[0]  # performance data, one per check
    assert lines[1].startswith(f"OK: daemon: answering at {answering} (")
    assert lines[2] == f"OK: state: {tmp_path / 'state'} writable, " + lines[2].split(", ")[1]
    assert lines[3].startswith(f"OK: pool scratch: {tmp_path / 'pool'} writable")
    assert sorted(os.listdir(tmp_path / "pool")) == []  # the probe's file is gone


def test_a_missing_pool_root_is_a_warning(tmp_path: Path, answering: Path) -> None:
    config = _config(tmp_path, answering)
    (tmp_path / "pool").rmdir()
    state, lines = _health(config)
    assert state == health.WARNING == 1
    assert lines[0].startswith(f"BBSTAGE WARNING - pool scratch: {tmp_path / 'pool'} does not")


def test_the_daemon_down_is_critical(tmp_path: Path) -> None:
    state, lines = _health(_config(tmp_path, tmp_path / "none.sock"))
    assert state == health.CRITICAL == 2
    assert lines[0].startswith("BBSTAGE CRITICAL - daemon: staging daemon not reachable at ")


def test_a_pool_not_writable_is_critical(
    tmp_path: Path, answering: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(directory: Path) -> None:
        if directory.name == "pool":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(health, "probe", read_only)  # the forked checks inherit it
    state, lines = _health(_config(tmp_path, answering))
    assert state == health.CRITICAL
    assert lines[0].startswith(
        f"BBSTAGE CRITICAL - pool scratch: {tmp_path / 'pool'} is not writable: Read-only file"
    )
    assert lines[2].startswith("OK: state: ")


def test_not_root_is_unknown_and_a_warning_outranks_it(
    tmp_path: Path, answering: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    config = _config(tmp_path, answering)
    state, lines = _health(config)
    assert state == health.UNKNOWN == 3
    assert lines[0].startswith("BBSTAGE UNKNOWN - state: not root: cannot test writing ")
    (tmp_path / "pool").rmdir()
    assert _health(config)[0] == health.WARNING


def test_a_check_that_raises_is_unknown() -> None:
    def broken() -> tuple[int, str]:
        raise RuntimeError("no idea")

    state, text = health.report(health.run([health.Check("x", "/x", broken)], 2))
    assert state == health.UNKNOWN
    assert text.startswith("BBSTAGE UNKNOWN - x: check failed: RuntimeError: no idea")


def test_an_unreadable_config_is_unknown(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bbstage.toml"
    bad.write_text("[daemon\n")
    assert health.main(str(bad)) == health.UNKNOWN
    assert capsys.readouterr().out.startswith("BBSTAGE UNKNOWN - cannot read the config: ")


def test_munge_not_usable_is_critical(
    tmp_path: Path, answering: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_: object, **__: object) -> bytes:
        raise munge.MungeError(6, "munge: Failed to access socket: No such file or directory")

    monkeypatch.setattr(munge, "encode", refuse)
    config = _config(tmp_path, answering, api_address="127.0.0.1:1", munge_socket=tmp_path / "m")
    # api_address: the client would use the API where the user socket is missing; here the
    # socket is there. munge is checked because the daemon's API needs it.
    state, lines = _health(config)
    assert state == health.CRITICAL
    assert (
        lines[0]
        == f"BBSTAGE CRITICAL - munge: munged at {tmp_path / 'm'}: "
        + ("munge: Failed to access socket: No such file or directory")
        + lines[0][lines[0].index(" | ") :]
    )


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_a_hung_check_ends_by_its_timeout_critical_naming_the_path(tmp_path: Path) -> None:
    """A check blocked for ever (opening a FIFO no one reads, as a read of a hung NFS file
    blocks) is killed at its deadline; the others answer; the command returns."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    pids = tmp_path / "pid"

    def hang() -> tuple[int, str]:
        pids.write_text(str(os.getpid()))
        with open(fifo, "w"):
            return health.OK, "never"

    started = time.monotonic()
    results = health.run(
        [health.Check("pool lustre", str(fifo), hang), health.Check("x", "/", lambda: (0, "y"))],
        timeout=1.0,
    )
    assert time.monotonic() - started < 3
    state, text = health.report(results)
    assert state == health.CRITICAL
    assert text.splitlines()[0].startswith(
        f"BBSTAGE CRITICAL - pool lustre: no answer within 1 s from {fifo} (hung file system?)"
    )
    assert text.splitlines()[2] == "OK: x: y"
    pid = int(pids.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)  # killed, not left to hang on


def test_a_hung_pool_file_system(
    tmp_path: Path, answering: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's write test hangs (its file system stopped answering): that pool is
    CRITICAL by the deadline, the daemon and state are still reported OK."""
    fifo = tmp_path / "pool" / "hung"
    real = health.probe

    def probe(directory: Path) -> None:
        if directory.name == "pool":
            open(fifo, "w").close()
        real(directory)

    config = _config(tmp_path, answering)
    os.mkfifo(fifo)
    monkeypatch.setattr(health, "probe", probe)
    started = time.monotonic()
    state, lines = _health(config, timeout=1.0)
    assert time.monotonic() - started < 3
    assert state == health.CRITICAL
    root = tmp_path / "pool"
    assert lines[0].startswith(
        f"BBSTAGE CRITICAL - pool scratch: no answer within 1 s from {root} (hung file system?)"
    )
    assert [line.split(":")[0] for line in lines[1:]] == ["OK", "OK", "CRITICAL"]


def test_a_slow_daemon_is_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "slow.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            time.sleep(0.7)
            conn.sendall(b'{"status": "ok", "result": {}}\n')

    threading.Thread(target=serve, daemon=True).start()
    try:
        state, lines = _health(_config(tmp_path, path), timeout=1.0)
    finally:
        server.close()
    assert state == health.WARNING
    assert lines[0].startswith(f"BBSTAGE WARNING - daemon: slow: answered at {path} in 0.")
