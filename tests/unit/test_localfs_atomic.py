"""localfs.atomic_file: unnamed (O_TMPFILE) files linked into place, named .part fallback."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from bbstage.movers import MoverOptions, TransferError, localfs
from bbstage.movers.base import FileTask
from bbstage.movers.implementations.posix import PosixMover
from tests.helpers import Sink


def task_for(tmp_path: Path, data: bytes, dst: Path) -> FileTask:
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    os.chmod(src, 0o640)
    st = src.stat()
    return FileTask(str(src), str(dst), "file", len(data), 0o640, st.st_mtime_ns)


def write(task: FileTask, data: bytes, sink: Sink) -> None:
    with localfs.atomic_file(task, "9", sink) as fd:
        os.write(fd, data)


@pytest.fixture(params=["tmpfile", "named"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "named":
        monkeypatch.setattr(localfs, "_tmpfile", False)
    return str(request.param)


def test_new_file_in_a_new_directory(tmp_path: Path, mode: str) -> None:
    dst = tmp_path / "a" / "b" / "out.bin"
    task = task_for(tmp_path, b"hello", dst)
    sink = Sink()
    write(task, b"hello", sink)
    assert dst.read_bytes() == b"hello"
    assert dst.stat().st_mode & 0o777 == 0o640
    assert dst.stat().st_mtime_ns == task.mtime_ns
    assert sorted(os.listdir(dst.parent)) == ["out.bin"]
    assert (sink.temps == []) == (mode == "tmpfile")  # unnamed files need no cleanup


def test_big_files_get_a_named_temporary_file(tmp_path: Path) -> None:
    data = b"x" * localfs.TMPFILE_MAX
    dst = tmp_path / "big.bin"
    sink = Sink()
    write(task_for(tmp_path, data, dst), data, sink)
    assert dst.read_bytes() == data
    assert len(sink.temps) == 1 and ".bbstage-9-" in sink.temps[0]
    assert not os.path.exists(sink.temps[0])


def test_replaces_an_existing_file_atomically(tmp_path: Path, mode: str) -> None:
    dst = tmp_path / "out.bin"
    dst.write_bytes(b"old contents")
    task = task_for(tmp_path, b"new", dst)
    write(task, b"new", Sink())
    assert dst.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["out.bin", "src.bin"]


def test_failure_leaves_nothing(tmp_path: Path, mode: str) -> None:
    dst = tmp_path / "d" / "out.bin"
    task = task_for(tmp_path, b"abcdef", dst)
    with pytest.raises(TransferError, match="size mismatch"):
        write(task, b"abc", Sink())  # short write
    assert not dst.exists() and os.listdir(dst.parent) == []
    dst.parent.chmod(0o500)
    try:
        if os.geteuid() != 0:  # root ignores directory permissions
            with pytest.raises(TransferError, match="permission denied"):
                write(task, b"abcdef", Sink())
    finally:
        dst.parent.chmod(0o700)


def test_mover_tree_through_both_paths(tmp_path: Path, mode: str) -> None:
    root = tmp_path / "t"
    for d in range(3):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(5):
            (root / f"d{d}" / f"f{f}").write_bytes(f"{d}{f}".encode() * 100)
    mover = PosixMover(MoverOptions())
    for task in mover.plan(f"{root}/", f"{tmp_path}/o/", tree=True, glob=False):
        mover.copy(task, Sink(), threading.Event())
    for d in range(3):
        for f in range(5):
            assert (tmp_path / "o" / f"d{d}" / f"f{f}").read_bytes() == f"{d}{f}".encode() * 100
        assert len(os.listdir(tmp_path / "o" / f"d{d}")) == 5


def test_fork_reopens_proc_fd(tmp_path: Path) -> None:
    """The /proc/self/fd handle must belong to the process that links (workers are forked)."""
    localfs._proc_dir()  # opened (and cached) in this process
    pid = os.fork()
    if pid == 0:  # child: a stale parent handle would link one of the parent's fds
        try:
            task = task_for(tmp_path, b"child", tmp_path / "child.bin")
            write(task, b"child", Sink())
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (tmp_path / "child.bin").read_bytes() == b"child"


def test_a_link_planted_at_the_temporary_name_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The .part file is created O_EXCL|O_NOFOLLOW: a link at its name is an error, not a path."""
    monkeypatch.setattr(localfs, "_tmpfile", False)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    dst = tmp_path / "d" / "out.bin"
    dst.parent.mkdir()
    planted = dst.parent / ".out.bin.planted.part"
    planted.symlink_to(victim)
    monkeypatch.setattr(localfs, "temp_name", lambda _dst, _job: str(planted))
    task = task_for(tmp_path, b"attacker's", dst)
    with pytest.raises(TransferError):
        write(task, b"attacker's", Sink())
    assert victim.read_bytes() == b"precious"
    assert not dst.exists()
