"""What the tests share: digests of files and trees, waits on a condition, tree makers, a free
port, and the recording stand-ins a worker or a mover reports to.

Tests check bytes, not exit codes: compare digests. Tests wait for a condition, never for a
fixed time: a loaded machine makes a fixed sleep too short, an idle one makes it too long.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from bbstage.transfer import TransferSpec, worker

T = TypeVar("T")

# -- digests ------------------------------------------------------------------------------------


def digest(data: bytes) -> str:
    """The sha256 of ``data``, in hex."""
    return hashlib.sha256(data).hexdigest()


def file_digest(path: str | bytes | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes, in hex; ``path`` may be bytes (a name that is not UTF-8)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tree_digests(root: Path) -> dict[str, str]:
    """Every regular file under ``root``, as relative path -> sha256: two trees hold the same
    bytes under the same names exactly when these are equal."""
    return {
        str(p.relative_to(root)): file_digest(p) for p in sorted(root.rglob("*")) if p.is_file()
    }


# -- waits --------------------------------------------------------------------------------------


def _timed_out(timeout: float, what: str | Callable[[], str]) -> AssertionError:
    detail = what() if callable(what) else what
    return AssertionError(f"timed out after {timeout:g} s waiting for {detail}")


def wait_until(
    pred: Callable[[], T], timeout: float, what: str | Callable[[], str], *, every: float = 0.02
) -> T:
    """Poll ``pred`` until it returns something true, and return that. After ``timeout`` seconds
    fail naming ``what`` was awaited (a callable is asked then, to show the state it found)."""
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what)
        time.sleep(every)
    return value


async def wait_until_async(
    pred: Callable[[], T], timeout: float, what: str | Callable[[], str], *, every: float = 0.001
) -> T:
    """``wait_until`` inside an event loop: the loop runs its callbacks between the polls."""
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, what)
        await asyncio.sleep(every)
    return value


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended: gone from /proc, or a zombie not yet reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"  # the state follows "(comm) "


# -- trees --------------------------------------------------------------------------------------


def make_tree(
    root: Path,
    files: int,
    size: int,
    *,
    digits: int = 5,
    fill: Literal["random", "rotated", "same"] = "random",
    sub: str = "",
) -> Path:
    """A new directory ``root`` of ``files`` files f00000, f00001... of ``size`` bytes each:
    random bytes each ("random"); one random block rotated by i % 7 ("rotated": one urandom
    call, neighbours differ); or one random block for all ("same"). With ``sub``, the
    odd-numbered files go in the subdirectory ``root/sub``."""
    root.mkdir(parents=True)
    if sub:
        (root / sub).mkdir()
    block = os.urandom(size) if fill != "random" else b""
    for i in range(files):
        if fill == "random":
            data = os.urandom(size)
        elif fill == "rotated":
            data = block[i % 7 :] + block[: i % 7]
        else:
            data = block
        (root / (sub if i % 2 else "") / f"f{i:0{digits}}").write_bytes(data)
    return root


# -- sockets ------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now: for a server to bind, or to be
    refused on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- what a worker and a mover report to --------------------------------------------------------


class Conn:
    """Stands for a worker's pipe to the executor: records every event sent."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def send(self, event: Any) -> None:
        self.events.append(event)


class Sink:
    """Stands for the worker's progress sink of a mover: bytes copied, temporary files made."""

    def __init__(self) -> None:
        self.bytes = 0
        self.temps: list[str] = []

    def add(self, n: int) -> None:
        self.bytes += n

    def temp(self, path: str) -> None:
        self.temps.append(path)


def run_worker(spec: TransferSpec) -> Conn:
    """Run one transfer in this process as a worker does; the events it sent."""
    conn = Conn()
    worker.run(spec, worker.Reporter(conn), threading.Event())  # type: ignore[arg-type]
    return conn


def corrupt_once(mover: Any, method: str) -> list[int]:
    """Flip a byte of the body of the first ``method`` call (after its Content-MD5 was made):
    what a bad NIC, proxy or server does. ``mover`` is an ``S3Upload``."""
    real = getattr(mover._client, method)
    calls: list[int] = []

    async def call(**kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            data = bytearray(kw["Body"])
            data[0] ^= 0xFF
            kw["Body"] = bytes(data)
        return await real(**kw)

    setattr(mover._client, method, call)
    return calls


def kill_with_a_temporary_file(dst: Path, workers: Callable[[], list[int]], daemon: int) -> None:
    """Freeze the ``workers`` while a temporary file (``.*.part``) exists under ``dst`` (a
    file can land between seeing its temporary name and the kill: CI saw that), then
    SIGKILL them and the ``daemon`` (stopped first, so it cannot remove them), as a power
    cut or an OOM kill would. Returns once the daemon is gone."""

    def temps() -> list[Path]:
        return list(dst.rglob(".*.part")) if dst.exists() else []

    frozen: list[int] = []
    for _ in range(20):
        wait_until(temps, 120, f"a temporary file in {dst}")
        frozen = workers()
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        if temps():
            break
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    os.kill(daemon, signal.SIGSTOP)
    for pid in frozen:
        os.kill(pid, signal.SIGKILL)
    os.kill(daemon, signal.SIGKILL)
    wait_until(lambda: process_gone(daemon), 20, f"the killed daemon (pid {daemon}) to end")
    assert temps(), "the kill came too late to leave a temporary file"


def s3_sides(conf: dict[str, Any]) -> dict[str, Any]:
    """``TransferSpec`` fields giving both sides the S3 options ``conf`` (``s3``, ``profile``,
    ``credentials``): the S3 mover takes them from its own side, the POSIX side ignores them."""
    from bbstage.movers.implementations.s3.settings import S3Options

    return {"source_options": S3Options(**conf), "destination_options": S3Options(**conf)}
