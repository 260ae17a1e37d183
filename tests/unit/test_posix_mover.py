"""The POSIX mover: files, trees, globs, links, atomicity, chunked copies."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from bbstage.movers import Cancelled, MoverOptions, TransferError
from bbstage.movers.implementations.posix import PosixMover
from tests.helpers import Sink


def copy_all(mover: PosixMover, src: str, dst: str, **kw: bool) -> Sink:
    sink = Sink()
    for task in mover.plan(src, dst, tree=kw.get("tree", False), glob=kw.get("glob", False)):
        mover.copy(task, sink, threading.Event())
    return sink


def test_file_keeps_bytes_mode_and_mtime(tmp_path: Path) -> None:
    src = tmp_path / "in.dat"
    src.write_bytes(os.urandom(100_000))
    os.chmod(src, 0o640)
    os.utime(src, ns=(1_000_000_000, 1_000_000_000))
    sink = copy_all(PosixMover(MoverOptions()), str(src), str(tmp_path / "out" / "o.dat"))
    out = tmp_path / "out" / "o.dat"
    assert out.read_bytes() == src.read_bytes()
    assert out.stat().st_mode & 0o777 == 0o640
    assert out.stat().st_mtime_ns == 1_000_000_000
    assert sink.bytes == 100_000
    assert not any(os.path.exists(t) for t in sink.temps)


def test_big_file_in_parallel_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bbstage.movers.implementations import posix

    monkeypatch.setattr(posix, "_same_device", lambda src, dst: False)  # as across devices
    streams = []
    real = posix._copy_range
    monkeypatch.setattr(posix, "_copy_range", lambda *a: (streams.append(a[2]), real(*a)))
    src = tmp_path / "big"
    src.write_bytes(os.urandom(5 * 1024 * 1024 + 7))
    mover = PosixMover(MoverOptions(threads=4, chunk_size=1024 * 1024))
    copy_all(mover, str(src), str(tmp_path / "copy"))
    assert (tmp_path / "copy").read_bytes() == src.read_bytes()
    assert len(streams) == 6


def test_big_file_on_one_device_is_one_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bbstage.movers.implementations import posix

    streams = []
    real = posix._copy_stream
    monkeypatch.setattr(posix, "_copy_stream", lambda *a: (streams.append(a[2]), real(*a)))
    monkeypatch.setattr(posix, "_copy_range", None)  # no chunks
    src = tmp_path / "big"
    src.write_bytes(os.urandom(3 * 1024 * 1024))
    copy_all(
        PosixMover(MoverOptions(threads=4, chunk_size=1024 * 1024)), str(src), str(tmp_path / "c")
    )
    assert (tmp_path / "c").read_bytes() == src.read_bytes()
    assert streams == [3 * 1024 * 1024]  # one stream, the whole file


def test_tree_with_empty_dir_and_symlink(tmp_path: Path) -> None:
    root = tmp_path / "refs"
    (root / "a" / "b").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a" / "b" / "x.txt").write_text("x")
    (root / "top.txt").write_text("top")
    os.symlink("/etc/shadow", root / "link")
    copy_all(PosixMover(MoverOptions()), f"{root}/", f"{tmp_path}/dst/", tree=True)
    dst = tmp_path / "dst"
    assert (dst / "a" / "b" / "x.txt").read_text() == "x"
    assert (dst / "top.txt").read_text() == "top"
    assert (dst / "empty").is_dir()
    assert os.readlink(dst / "link") == "/etc/shadow"  # copied as a link, never followed


def test_glob(tmp_path: Path) -> None:
    for name in ("a.dat", "b.dat", "c.txt"):
        (tmp_path / name).write_text(name)
    copy_all(PosixMover(MoverOptions()), f"{tmp_path}/*.dat", f"{tmp_path}/g/", glob=True)
    assert sorted(os.listdir(tmp_path / "g")) == ["a.dat", "b.dat"]


def test_missing_source_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(TransferError, match=f"no such file or directory: {tmp_path}/nope"):
        PosixMover(MoverOptions()).plan(f"{tmp_path}/nope", "/x", tree=False, glob=False)


def test_directory_without_trailing_slash_is_explained(tmp_path: Path) -> None:
    with pytest.raises(TransferError, match="end the source and destination with /"):
        PosixMover(MoverOptions()).plan(str(tmp_path), "/x", tree=False, glob=False)


def test_cancel_leaves_no_partial_file(tmp_path: Path) -> None:
    src = tmp_path / "big"
    src.write_bytes(b"\0" * (40 << 20))
    mover = PosixMover(MoverOptions(threads=1))
    (task,) = mover.plan(str(src), str(tmp_path / "out"), tree=False, glob=False)
    cancel = threading.Event()
    cancel.set()
    sink = Sink()
    with pytest.raises(Cancelled):
        mover.copy(task, sink, cancel)
    assert not (tmp_path / "out").exists()
    assert not any(os.path.exists(t) for t in sink.temps)


def test_checksum_verified(tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_bytes(os.urandom(10_000))
    for algo in ("xxh3", "blake2b"):
        copy_all(PosixMover(MoverOptions(checksum=algo)), str(src), str(tmp_path / algo))
        assert (tmp_path / algo).read_bytes() == src.read_bytes()


def test_current_detects_an_already_staged_file(tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_text("data")
    mover = PosixMover(MoverOptions())
    (task,) = mover.plan(str(src), str(tmp_path / "g"), tree=False, glob=False)
    assert mover.current(task) is None
    mover.copy(task, Sink(), threading.Event())
    assert mover.current(task) is True


def test_one_stream_between_local_disks_all_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bbstage.movers.implementations import posix

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"x")
    mover = PosixMover(MoverOptions(threads=8))
    tasks = list(mover.plan(f"{tmp_path}/src/", f"{tmp_path}/new/dst/", tree=True, glob=False))
    monkeypatch.setattr(posix, "_on_block_device", lambda path: True)
    assert mover.streams(tasks) == 1
    monkeypatch.setattr(
        posix, "_on_block_device", lambda path: not path.startswith(str(tmp_path / "new"))
    )
    assert mover.streams(tasks) == 8  # e.g. staging onto NFS or Lustre


def test_prefetch_is_only_a_hint(tmp_path: Path) -> None:
    from bbstage.movers.base import FileTask

    mover = PosixMover(MoverOptions())
    (tmp_path / "f").write_bytes(b"x" * 100)
    mover.prefetch(FileTask(str(tmp_path / "f"), str(tmp_path / "g"), "file", 100))
    mover.prefetch(FileTask(str(tmp_path / "gone"), str(tmp_path / "g"), "file", 100))
    assert not (tmp_path / "g").exists()
