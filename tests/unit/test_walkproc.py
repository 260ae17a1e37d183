"""The walk in a process of its own (issue 17, goal 2): a big POSIX tree is walked by a
fresh interpreter beside the copy. It stays a bounded window ahead, its errors (and its
death) fail the transfer as they would in a thread, it honours the scratch budget, and it
never outlives the copy. (A tree changing while it is walked: ``test_plan_stream``.)"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bbstage.movers import FileTask
from bbstage.movers.implementations import posix
from bbstage.transfer import Done, Failed, Planned, ScratchLimit, TransferSpec, walkproc, worker
from tests.helpers import Conn, make_tree, tree_digests

ROOT = str(Path(__file__).resolve().parents[2])


def spec(src: Path | str, dst: Path | str, **kw: Any) -> TransferSpec:
    return TransferSpec.between(f"{src}/", f"{dst}/", job_id="7", **kw)


def transfer(s: TransferSpec) -> list[Any]:
    """Run one transfer as a worker does, outcome included; the events it sent."""
    conn = Conn()
    worker.transfer(s, worker.Reporter(conn), threading.Event())
    return conn.events


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[bytes]]:
    """Every tree of more than 50 entries walks apart; the walks' processes, as started."""
    monkeypatch.setattr(walkproc, "MANY", 50)
    started: list[subprocess.Popen[bytes]] = []
    enter = walkproc.WalkApart.__enter__

    def spy(self: walkproc.WalkApart) -> walkproc.WalkApart:
        enter(self)
        started.append(self.proc)
        return self

    monkeypatch.setattr(walkproc.WalkApart, "__enter__", spy)
    return started


def in_the_walk(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    """Run ``code`` in the walk's process before it walks (a fault to inject)."""
    main = "from bbstage.transfer import walkproc\nwalkproc.main()\n"
    command = [sys.executable, "-c", code + "\n" + main]
    monkeypatch.setattr(walkproc, "COMMAND", command)


def test_a_big_tree_is_walked_apart_and_a_small_one_by_a_thread(
    tmp_path: Path, walks: list[subprocess.Popen[bytes]]
) -> None:
    small = make_tree(tmp_path / "small", 40, 10)
    assert transfer(spec(small, tmp_path / "a"))[-1] == Done(400, 40)
    assert walks == []
    big = make_tree(tmp_path / "big", 600, 100, sub="s")
    events = transfer(spec(big, tmp_path / "b"))
    assert events[-1] == Done(60_000, 600)
    final = [e for e in events if isinstance(e, Planned) and e.final]
    assert final == [Planned(60_000, 600)] and events.index(final[0]) < len(events) - 1
    assert tree_digests(tmp_path / "b") == tree_digests(big)
    assert len(walks) == 1 and walks[0].returncode is not None  # ended and reaped


def test_the_walk_stays_a_window_ahead_of_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, walks: list[subprocess.Popen[bytes]]
) -> None:
    """The copy stops at its tenth file: the walk (which makes each directory as it goes,
    here a chain of them, a file in each) stops a few chunks later, not at the end of the
    tree or of the pipe's room."""
    monkeypatch.setattr(worker, "READ_AHEAD_FILES", 32)  # chunks of 2 files
    src = here = tmp_path / "src"
    for _ in range(300):
        here = here / "c"
        here.mkdir(parents=True)
        (here / "f").write_bytes(b"x")
    gate, copied = threading.Event(), [0]
    copy = posix.PosixMover.copy

    def stalling(self: Any, task: FileTask, progress: Any, cancel: threading.Event) -> None:
        if task.kind == "file":
            copied[0] += 1
            if copied[0] > 10:
                gate.wait()
        copy(self, task, progress, cancel)

    def depth() -> int:
        n, here = 0, tmp_path / "dst" / "c"
        while here.exists():
            n, here = n + 1, here / "c"
        return n

    monkeypatch.setattr(posix.PosixMover, "copy", stalling)
    run = threading.Thread(target=transfer, args=(spec(src, tmp_path / "dst"),))
    run.start()
    made = -1
    for _ in range(100):  # until the walk has stopped making directories
        time.sleep(0.1)
        if depth() == made:
            break
        made = depth()
    gate.set()
    run.join()
    assert 10 < made < 100, f"the walk ran {made} directories ahead of a stalled copy"
    assert depth() == 300
    assert tree_digests(tmp_path / "dst") == tree_digests(src)


def test_an_error_of_the_walk_fails_the_transfer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, walks: list[subprocess.Popen[bytes]]
) -> None:
    """The walk's error crosses from its process to the copy, message and kind kept."""
    in_the_walk(
        monkeypatch,
        "from bbstage.movers import localfs, TransferError\n"
        "entry = localfs._entry\n"
        "def failing(path, dst, st=None):\n"
        "    if path.endswith('f00500'):\n"
        "        raise TransferError(f'permission denied: {path}')\n"
        "    return entry(path, dst, st)\n"
        "localfs._entry = failing\n",
    )
    src = make_tree(tmp_path / "src", 600, 100)
    events = transfer(spec(src, tmp_path / "dst"))
    assert isinstance(events[-1], Failed) and events[-1].permanent
    assert events[-1].message.startswith("permission denied:") and "f00500" in events[-1].message
    assert not any(isinstance(e, Planned) and e.final for e in events)
    assert len(walks) == 1 and walks[0].returncode is not None


def test_a_killed_walk_fails_the_transfer_for_a_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, walks: list[subprocess.Popen[bytes]]
) -> None:
    """The walk's process killed mid-walk: no ``Done``, a transient failure, no temp file."""
    in_the_walk(
        monkeypatch,
        "import os, signal\n"
        "from bbstage.transfer import walkproc\n"
        "hand_on, n = walkproc._Sending.hand_on, [0]\n"
        "def dying(self, chunk, force=False):\n"
        "    n[0] += 1\n"
        "    if n[0] == 5:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return hand_on(self, chunk, force)\n"
        "walkproc._Sending.hand_on = dying\n",
    )
    src = make_tree(tmp_path / "src", 2000, 100)
    events = transfer(spec(src, tmp_path / "dst"))
    assert isinstance(events[-1], Failed) and not events[-1].permanent
    assert "walk" in events[-1].message
    assert not any(isinstance(e, Done) for e in events)
    assert list((tmp_path / "dst").rglob("*.part")) == []


def test_the_walk_keeps_to_the_scratch_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, walks: list[subprocess.Popen[bytes]]
) -> None:
    """The tree grows past the capacity left after the worker's check, before the walk:
    the walk's process fails the transfer, as the thread would."""
    src = make_tree(tmp_path / "src", 100, 100)
    in_the_walk(monkeypatch, f"open({str(src / 'grown')!r}, 'wb').write(b'x' * 5000)\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    events = transfer(spec(src, scratch / "in", scratch_limit=ScratchLimit(str(scratch), 12_000)))
    assert isinstance(events[-1], Failed) and "source grew" in events[-1].message
    assert len(walks) == 1


@pytest.mark.parametrize("ahead", [32, 2048], ids=["waiting-for-credit", "pipe-full"])
def test_the_walk_ends_with_its_worker(tmp_path: Path, ahead: int) -> None:
    """A killed worker leaves no walk behind: its process sees the pipe close and exits,
    whether it waits for the copy to take a chunk or for room in the pipe."""
    src = make_tree(tmp_path / "src", 3000, 10)
    code = (
        "import threading\n"
        "from bbstage.transfer import walkproc, worker\n"
        "from bbstage.transfer import TransferSpec\n"
        f"worker.READ_AHEAD_FILES = {ahead}\n"
        "enter = walkproc.WalkApart.__enter__\n"
        "def spy(self):\n"
        "    enter(self)\n"
        "    print(self.proc.pid, flush=True)\n"
        "    threading.Event().wait()  # the copy never takes a chunk\n"
        "walkproc.WalkApart.__enter__ = spy\n"
        f"spec = TransferSpec.between('{src}/', '{tmp_path}/dst/', job_id='7')\n"
        "worker.transfer(spec, worker.Reporter(None), threading.Event())\n"
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    time.sleep(0.3)  # the walk has filled what it may
    proc.kill()
    proc.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, os.WNOHANG)
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the walk's process outlived its worker")


def test_the_walk_imports_the_workers_own_bbstage(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its PYTHONPATH puts the worker's bbstage first and keeps what the worker had (a
    site's libraries may be found that way)."""
    monkeypatch.setenv("PYTHONPATH", "/opt/site-libs")
    assert walkproc.own_pythonpath() == f"{ROOT}{os.pathsep}/opt/site-libs"
    monkeypatch.delenv("PYTHONPATH")
    assert walkproc.own_pythonpath() == ROOT
