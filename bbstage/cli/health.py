"""`bbstage health`: one check for a monitoring system (Nagios, Icinga, NRPE, Zabbix).

The checks: the daemon answers on its user socket (or network API); the state directory
takes a file; every pool root exists and takes a file; munged makes and checks a credential
(only with ``api_address``). Each runs in a forked child with its own deadline: a hung
file system (an NFS or Lustre server gone, a stopped munged) leaves a child stuck in the
kernel, never this command, which kills it, reports CRITICAL naming the path and exits.

Output (Nagios plugin format): the first line ``BBSTAGE STATE - reason``, the reason being
the worst checks' messages (or a summary when all are OK), then ``|`` and each check's
time as performance data; then one line per check. Exit code 0 OK, 1 WARNING, 2 CRITICAL,
3 UNKNOWN (the config unreadable, or a check that could not be made: not root).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bbstage.config import Config

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
WORST = (OK, UNKNOWN, WARNING, CRITICAL)  # in order: the overall state is the last one met
TIMEOUT = 10.0  # seconds each check may take (they run at once)
STATE_FREE = 100 << 20  # bytes free under state_dir below which it is a WARNING


@dataclass(frozen=True)
class Check:
    """One check: ``run`` gives (state, message); ``where`` and ``hint`` are named if it
    hangs."""

    name: str
    where: str
    run: Callable[[], tuple[int, str]]
    hint: str = "hung file system?"


@dataclass(frozen=True)
class Result:
    name: str
    state: int
    message: str
    seconds: float


def probe(directory: Path) -> None:
    """Write, flush to disk and remove a file in ``directory`` (OSError if it cannot)."""
    path = directory / f".bbstage-health-{os.getpid()}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, b"bbstage health\n")
        os.fsync(fd)
    finally:
        os.close(fd)
        path.unlink()


def _mib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"


def check_daemon(config: Config, timeout: float) -> tuple[int, str]:
    from bbstage.client import DaemonError, Unreachable, call, target

    where = target(config.user_socket, config.api_address, config.munge_socket)
    started = time.monotonic()
    try:
        pools = call(where, "pools", timeout=timeout)
    except Unreachable as exc:
        return CRITICAL, str(exc)
    except DaemonError as exc:
        return CRITICAL, f"answered with an error at {where}: {exc}"
    seconds = time.monotonic() - started
    if seconds > timeout / 2:
        return WARNING, f"slow: answered at {where} in {seconds:.1f} s"
    return OK, f"answering at {where} ({seconds * 1000:.0f} ms, {len(pools)} pools)"


def _not_writable(path: Path) -> tuple[int, str] | None:
    """Why root cannot write a file in ``path`` (None: it can)."""
    if os.geteuid() != 0:
        return UNKNOWN, f"not root: cannot test writing {path} (run as root, e.g. sudo)"
    try:
        probe(path)
    except OSError as exc:
        return CRITICAL, f"{path} is not writable: {exc.strerror or exc}"
    return None


def check_state(config: Config) -> tuple[int, str]:
    state = config.state_dir
    if not state.is_dir():
        return CRITICAL, f"{state} does not exist or is not a directory"
    if failed := _not_writable(state):
        return failed
    free = os.statvfs(state)
    free_bytes = free.f_bavail * free.f_frsize
    if free_bytes < STATE_FREE:
        return WARNING, f"{state}: only {_mib(free_bytes)} free"
    return OK, f"{state} writable, {_mib(free_bytes)} free"


def check_pool(root: Path) -> tuple[int, str]:
    if not root.exists():
        return WARNING, f"{root} does not exist (made at the first job's setup; not mounted?)"
    if not root.is_dir():
        return CRITICAL, f"{root} is not a directory"
    if failed := _not_writable(root):
        return failed
    free = os.statvfs(root)
    return OK, f"{root} writable, {_mib(free.f_bavail * free.f_frsize)} free"


def check_munge(socket: Path) -> tuple[int, str]:
    from bbstage import munge

    try:
        decoded = munge.decode(munge.encode(b"bbstage health", socket), socket)
    except munge.MungeError as exc:
        return CRITICAL, f"munged at {socket}: {exc}"
    if decoded.payload != b"bbstage health" or decoded.uid != os.geteuid():
        return CRITICAL, f"munged at {socket} gave back another credential"
    return OK, f"munged at {socket} makes and checks credentials"


def checks(config: Config, timeout: float = TIMEOUT) -> list[Check]:
    """What ``bbstage health`` checks for ``config``."""
    out = [
        Check(
            "daemon",
            str(config.user_socket),
            lambda: check_daemon(config, timeout),
            "daemon hung or overloaded?",
        ),
        Check("state", str(config.state_dir), lambda: check_state(config)),
    ]
    for pool in config.pools:
        out.append(Check(f"pool {pool.name}", str(pool.root), lambda r=pool.root: check_pool(r)))
    if config.api_address:
        socket = config.munge_socket
        out.append(Check("munge", str(socket), lambda: check_munge(socket), "munged hung?"))
    return out


def _child(check: Check, fd: int) -> None:
    """In the forked child: run the check, write its result, exit (never return)."""
    try:
        try:
            state, message = check.run()
        except Exception as exc:  # a check that could not be made says so
            state, message = UNKNOWN, f"check failed: {type(exc).__name__}: {exc}"
        os.write(fd, json.dumps([state, message]).encode())
    finally:
        os._exit(0)


def run(checks: list[Check], timeout: float = TIMEOUT) -> list[Result]:
    """Each check in a child of its own, all at once; one that has not answered within
    ``timeout`` seconds is killed (SIGKILL: a process in a hung NFS or Lustre call dies when
    the call returns, or at once where it sleeps killable) and is CRITICAL, naming where."""
    sys.stdout.flush()
    sys.stderr.flush()
    started = time.monotonic()
    children: dict[int, tuple[Check, int, bytearray]] = {}  # read end -> check, pid, data
    selector = selectors.DefaultSelector()
    for check in checks:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            _child(check, write)
        os.close(write)
        children[read] = (check, pid, bytearray())
        selector.register(read, selectors.EVENT_READ)
    ended: dict[str, Result] = {}
    deadline = started + timeout
    while len(ended) < len(checks) and (left := deadline - time.monotonic()) > 0:
        for key, _ in selector.select(left):
            check, pid, data = children[key.fd]
            chunk = os.read(key.fd, 65536)
            if chunk:
                data += chunk
                continue
            selector.unregister(key.fd)
            os.close(key.fd)
            os.waitpid(pid, 0)
            try:
                state, message = json.loads(data)
            except ValueError:
                state, message = UNKNOWN, "check ended without a result"
            ended[check.name] = Result(check.name, state, message, time.monotonic() - started)
    for fd, (check, pid, _) in children.items():
        if check.name in ended:
            continue
        os.kill(pid, signal.SIGKILL)
        selector.unregister(fd)
        os.close(fd)
        os.waitpid(pid, os.WNOHANG)  # reaped if it died already; else init reaps it
        message = f"no answer within {timeout:g} s from {check.where} ({check.hint})"
        ended[check.name] = Result(check.name, CRITICAL, message, timeout)
    selector.close()
    return [ended[check.name] for check in checks]


def _perf(name: str) -> str:
    label = name.replace(" ", "_").replace("'", "").replace("=", "_")
    return f"'{label}'"


def report(results: list[Result]) -> tuple[int, str]:
    """The exit code and the plugin's output for ``results``."""
    state = max((r.state for r in results), key=WORST.index, default=UNKNOWN)
    if not results:
        reason = "nothing to check"
    elif state == OK:
        pools = sum(r.name.startswith("pool ") for r in results)
        reason = f"daemon answering, state and {pools} pool(s) writable"
        if any(r.name == "munge" for r in results):
            reason += ", munge usable"
    else:
        reason = "; ".join(f"{r.name}: {r.message}" for r in results if r.state == state)
    perf = " ".join(f"{_perf(r.name)}={r.seconds:.3f}s" for r in results)
    lines = [f"BBSTAGE {NAMES[state]} - {reason}" + (f" | {perf}" if perf else "")]
    lines += [f"{NAMES[r.state]}: {r.name}: {r.message}" for r in results]
    return state, "\n".join(lines)


def main(config_path: str, timeout: float = TIMEOUT) -> int:
    from bbstage import config

    try:
        conf = config.load(config_path)
    except (config.ConfigError, OSError) as exc:
        print(f"BBSTAGE UNKNOWN - cannot read the config: {exc}")
        return UNKNOWN
    state, text = report(run(checks(conf, timeout), timeout))
    print(text)
    return state
