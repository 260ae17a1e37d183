"""A real daemon on a real ZeroMQ socket, and the real Lua hooks run by a Lua outside Slurm.

The hooks are installed by `bbstage install-lua --lua 5.N` for the interpreter that runs them
(the ``lua`` fixture, tests/luas.py), precompiled as they would be for such a Slurm.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .helpers import wait_until
from .luas import lua_fixture, version

REPO = Path(__file__).resolve().parents[1]
USER = "bbuser1"


@dataclass
class Daemon:
    root: Path
    config: Path
    etc: Path
    proc: subprocess.Popen[bytes]
    lua: str  # the interpreter the hooks run under, e.g. "lua5.4"

    def hook(self, name: str, *args: str | None) -> tuple[int, str]:
        argv = ["nil" if a is None else str(a) for a in args]
        out = subprocess.run(
            [self.lua, str(REPO / "tests" / "lua" / "call_hook.lua"), str(self.etc), name, *argv],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        first, _, rest = out.stdout.partition("\n")
        return int(first.removeprefix("rc=")), rest.rstrip("\n")

    def cli(self, *args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = ["runuser", "-u", user, "--"] if user else []
        return subprocess.run(
            [*argv, sys.executable, "-m", "bbstage.cli.main", "--config", str(self.config), *args],
            capture_output=True, text=True, timeout=60, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(20)


def script(path: Path, *lines: str) -> str:
    """A job script at ``path`` with ``#BB_LUA`` lines, readable by the daemon; its path."""
    path.write_text("#!/bin/bash\n" + "".join(f"#BB_LUA {line}\n" for line in lines) + "true\n")
    path.chmod(0o644)
    return str(path)


def user_ids(name: str = USER) -> tuple[int, int]:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        pytest.fail(f"test user {name} missing: run scripts/local-cluster up (scripts/test does)")
    return pw.pw_uid, pw.pw_gid


def start_daemon(root: Path, extra: str = "", lua: str = "lua5.1") -> Daemon:
    """A daemon in ``root``; its hooks installed for (and run by) the interpreter ``lua``."""
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    config = etc / "bbstage.toml"
    config.write_text(
        f"""[daemon]
socket = "{root}/run/control.sock"
user_socket = "{root}/run/user.sock"
state_dir = "{root}/state"
reconcile_interval = 0
{extra or 'metrics_address = ""'}
[[pools]]
name = "scratch"
root = "{root}/scratch"
capacity = "64M"
granularity = "1M"
"""
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(
        [sys.executable, "-m", "bbstage.cli.main", "--config", str(config), "install-lua",
         "--dest", str(etc), "--lua", version(lua)],
        check=True, env=env, capture_output=True,
    )  # fmt: skip
    log = root / "daemon.log"
    offset = log.stat().st_size if log.exists() else 0  # a restart appends to the same log
    with open(log, "ab") as out:  # the daemon holds its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "bbstage.cli.main", "--config", str(config), "daemon"],
            stdout=out, stderr=out, env=env, cwd=REPO,
        )  # fmt: skip

    def started() -> bool:
        # Not the socket file: a killed daemon leaves its own behind.
        assert proc.poll() is None, log.read_text()
        with open(log, "rb") as f:
            f.seek(offset)
            return b'"daemon started"' in f.read()

    wait_until(started, 20, f"the daemon to log that it started, in {log}")
    return Daemon(root, config, etc, proc, lua)


@pytest.fixture
def area() -> Iterator[Path]:
    """A directory the test user can reach (pytest's tmp_path is root-only)."""
    base = Path("/var/tmp/bbstage-tests")
    base.mkdir(mode=0o755, exist_ok=True)
    base.chmod(0o755)
    path = base / uuid.uuid4().hex[:10]
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# Every interpreter; a module may narrow it (test_hooks_daemon.py: the slow suite, ENDS).
lua = lua_fixture()


@pytest.fixture
def daemon(area: Path, lua: str) -> Iterator[Daemon]:
    d = start_daemon(area / "daemon", lua=lua)
    yield d
    if d.proc.poll() is None:
        d.stop()


def hooks_without_daemon(root: Path, lua: str) -> Daemon:
    """The real hooks installed under ``root`` for ``lua``, talking to ``root/control.sock``,
    where no daemon runs: a test puts its own ZeroMQ ROUTER there (tests/test_zmtp_lua.py)."""
    etc, config = root / "etc", root / "bbstage.toml"
    config.write_text(f'[daemon]\nsocket = "{root}/control.sock"\n')
    subprocess.run(
        [sys.executable, "-m", "bbstage.cli.main", "--config", str(config), "install-lua",
         "--dest", str(etc), "--lua", version(lua)],
        check=True, capture_output=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    return Daemon(root, config, etc, None, lua)  # type: ignore[arg-type]


def user_tree(path: Path, uid: int, gid: int) -> Path:
    for p in [path, *path.rglob("*")]:
        os.chown(p, uid, gid, follow_symlinks=False)
    return path


@dataclass
class Staging:
    """A stage-in started on a daemon the 24.05+ way (setup, then data_in returns at once)."""

    job: str  # the job id
    script: str  # its script's path
    source: Path
    destination: Path
    held: list[int]  # its workers, SIGSTOPped as they appeared (``hold``): SIGCONT them


def stage_in_started(d: Daemon, area: Path, job: str, size: int, hold: bool = False) -> Staging:
    """Job ``job`` staging a random file of ``size`` bytes from ``area/data`` to
    ``area/out`` as the test user; returns once the daemon has started it. ``hold``: its
    worker is stopped (SIGSTOP) as soon as it appears, so the transfer cannot end."""
    from .campaign import worker_pids

    uid, gid = user_ids()
    for name in ("data", "out"):
        (area / name).mkdir(exist_ok=True)
        os.chown(area / name, uid, gid)
    source, destination = area / "data" / f"{job}.dat", area / "out" / f"{job}.dat"
    source.write_bytes(os.urandom(size))
    os.chown(source, uid, gid)
    path = script(area / f"{job}.sh", f"stage_in source={source} destination={destination}")
    u, g = str(uid), str(gid)
    assert d.hook("slurm_bb_setup", job, u, g, "scratch", "0", path, None)[0] == 0
    held: list[int] = []
    stop = threading.Event()

    def catch() -> None:  # every worker of the daemon, stopped as it shows
        while not stop.is_set():
            for pid in set(worker_pids(d.proc.pid)) - set(held):
                os.kill(pid, signal.SIGSTOP)
                held.append(pid)
            time.sleep(0.002)

    catcher = threading.Thread(target=catch, daemon=True)
    if hold:
        catcher.start()
    assert d.hook("slurm_bb_data_in", job, path, u, g, None)[0] == 0
    if hold:
        wait_until(lambda: held, 30, "the stage-in's worker")
        stop.set()
        catcher.join()
        assert not destination.exists(), "the transfer ended before its worker was held"
    return Staging(job, path, source, destination, held)


def staged_job(area: Path, job_id: str) -> Iterator[tuple[Daemon, int]]:
    """A daemon with metrics on a free port and job ``job_id`` staged in (one 5000-byte
    file into its scratch): yields the daemon and the port, stops it after."""
    from .helpers import free_port

    port = free_port()
    d = start_daemon(area / "d", extra=f'metrics_address = "127.0.0.1:{port}"')
    uid, gid = user_ids()
    src = area / "src"
    src.mkdir()
    (src / "a.dat").write_bytes(b"a" * 5000)
    user_tree(src, uid, gid)
    job = script(area / "job.sh", f"stage_in source={src}/a.dat destination=$BB_SCRATCH/a.dat")
    d.hook("slurm_bb_setup", job_id, str(uid), str(gid), "scratch", str(8 << 20), job)
    assert d.hook("slurm_bb_data_in", job_id, job) == (0, "")
    yield d, port
    d.stop()
