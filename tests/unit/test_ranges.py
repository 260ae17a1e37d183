"""Byte ranges of one file written by several workers into one temporary file and put in
place once (``bbstage.transfer.ranges``): the bytes are the source's, exactly one range renames, the
old file stays whole until then, and a temporary file made again midway never lands."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest

from bbstage.movers.base import FileTask, TransferError
from bbstage.transfer import FileRange
from bbstage.transfer.ranges import span, write_range

SIZE = (3 << 20) + 12345


def copier(src: Path):  # type: ignore[no-untyped-def]
    def copy(fd: int, offset: int, count: int) -> None:
        with open(src, "rb") as f:
            f.seek(offset)
            data = f.read(count)
        assert len(data) == count
        os.pwrite(fd, data, offset)

    return copy


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "src"
    path.write_bytes(os.urandom(SIZE))
    return path


def task(src: Path, dst: Path) -> FileTask:
    return FileTask(str(src), str(dst), "file", SIZE, 0o640, 1_600_000_000_123_456_789)


@pytest.mark.parametrize("count", [1, 2, 5])
def test_ranges_in_any_order_reassemble_the_file_and_exactly_one_puts_it_in_place(
    tmp_path: Path, src: Path, count: int
) -> None:
    for round_ in range(10):
        dst = tmp_path / f"out{round_}"
        renamed: list[bool] = []
        parts = [FileRange(i, count, f"{round_:08x}") for i in range(count)]
        random.shuffle(parts)

        def run(part: FileRange, dst: Path = dst, renamed: list[bool] = renamed) -> None:
            renamed.append(write_range(task(src, dst), "7", part, copier(src)))

        threads = [threading.Thread(target=run, args=(p,)) for p in parts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert renamed.count(True) == 1
        assert dst.read_bytes() == src.read_bytes()
        st = dst.stat()
        assert (st.st_mode & 0o777, st.st_mtime_ns) == (0o640, 1_600_000_000_123_456_789)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["src"] + [f"out{i}" for i in range(10)]
    )


def test_the_old_file_stays_whole_until_the_last_range_ends(tmp_path: Path, src: Path) -> None:
    dst = tmp_path / "out"
    dst.write_bytes(b"the old file")
    for i in (2, 0):
        assert not write_range(task(src, dst), "7", FileRange(i, 3, "0000abcd"), copier(src))
        assert dst.read_bytes() == b"the old file"
    assert write_range(task(src, dst), "7", FileRange(1, 3, "0000abcd"), copier(src))
    assert dst.read_bytes() == src.read_bytes()


def test_a_range_written_again_is_harmless(tmp_path: Path, src: Path) -> None:
    """Dask reruns a range whose node died after it wrote: same bytes, same result."""
    dst = tmp_path / "out"
    write_range(task(src, dst), "7", FileRange(0, 2, "0000abcd"), copier(src))
    write_range(task(src, dst), "7", FileRange(0, 2, "0000abcd"), copier(src))
    assert write_range(task(src, dst), "7", FileRange(1, 2, "0000abcd"), copier(src))
    assert dst.read_bytes() == src.read_bytes()


def test_a_temporary_file_made_again_midway_never_lands(tmp_path: Path, src: Path) -> None:
    """A sweep removed the temporary file after range 0 was written: range 1 makes a new
    one, holding only its own bytes; putting that in place would stage a file of zeros."""
    dst = tmp_path / "out"
    dst.write_bytes(b"the old file")
    write_range(task(src, dst), "7", FileRange(0, 2, "0000abcd"), copier(src))
    (temp,) = [p for p in tmp_path.iterdir() if p.name.endswith("-0000abcd.part")]
    temp.unlink()
    with pytest.raises(TransferError, match="removed while they were written") as err:
        write_range(task(src, dst), "7", FileRange(1, 2, "0000abcd"), copier(src))
    assert not err.value.permanent
    assert dst.read_bytes() == b"the old file"


def test_siblings_that_finish_before_the_creator_looks_are_not_taken_for_a_sweep(
    tmp_path: Path, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Range 0 creates the temporary file; before it looks for markers, ranges 1 and 2 open
    that file, write into it and leave their markers (a small file, a slow thread). Those
    name range 0's file: no sweep happened, and the file lands whole. (Seen as "removed
    while they were written" in 1 of ~20 runs of the 5-thread test above.)"""
    dst = tmp_path / "out"
    real_open = os.open
    siblings: list[bool] = []

    def open_then_siblings(path: str, flags: int, *args: int, **kw: int) -> int:
        fd = real_open(path, flags, *args, **kw)
        if flags & os.O_EXCL and path.endswith("-0000abcd.part") and not siblings:
            siblings.append(True)
            for i in (1, 2):
                assert not write_range(
                    task(src, dst), "7", FileRange(i, 3, "0000abcd"), copier(src)
                )
        return fd

    monkeypatch.setattr(os, "open", open_then_siblings)
    assert write_range(task(src, dst), "7", FileRange(0, 3, "0000abcd"), copier(src))
    assert siblings and dst.read_bytes() == src.read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_older_groups_temporary_file_is_never_taken_for_this_ones(
    tmp_path: Path, src: Path
) -> None:
    dst = tmp_path / "out"
    write_range(task(src, dst), "7", FileRange(0, 2, "00000001"), copier(src))  # then it failed
    write_range(task(src, dst), "7", FileRange(1, 2, "00000002"), copier(src))
    assert not dst.exists()
    assert write_range(task(src, dst), "7", FileRange(0, 2, "00000002"), copier(src))
    assert dst.read_bytes() == src.read_bytes()


def test_spans_cover_the_file_once() -> None:
    for size in (0, 1, 7, SIZE):
        for count in (1, 2, 3, 8):
            spans = [span(FileRange(i, count, "0"), size) for i in range(count)]
            assert sum(n for _, n in spans) == size
            assert all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:], strict=False))


def test_a_temporary_file_removed_under_the_last_range_never_lands(
    tmp_path: Path, src: Path
) -> None:
    """Removed while the last range writes into it (its fd keeps the inode): the rename
    finds no file, and the destination is not that inode, so nothing is in place."""
    dst = tmp_path / "out"
    dst.write_bytes(b"the old file")
    write_range(task(src, dst), "7", FileRange(0, 2, "0000abcd"), copier(src))

    def copy_then_swept(fd: int, offset: int, count: int) -> None:
        copier(src)(fd, offset, count)
        for p in tmp_path.iterdir():
            if p.name.endswith("-0000abcd.part"):
                p.unlink()

    with pytest.raises(TransferError, match="gone|removed") as err:
        write_range(task(src, dst), "7", FileRange(1, 2, "0000abcd"), copy_then_swept)
    assert not err.value.permanent
    assert dst.read_bytes() == b"the old file"


def test_ranges_written_into_two_different_files_never_land(tmp_path: Path, src: Path) -> None:
    """Range 0 writes into the file; it is removed, and range 1 makes a new one before any
    range ended. Each holds half the bytes: the markers name two files, nothing lands."""
    dst = tmp_path / "out"
    dst.write_bytes(b"the old file")

    def copy_while_swept(fd: int, offset: int, count: int) -> None:
        copier(src)(fd, offset, count)
        (temp,) = [p for p in tmp_path.iterdir() if p.name.endswith("-0000abcd.part")]
        temp.unlink()
        assert not write_range(task(src, dst), "7", FileRange(1, 2, "0000abcd"), copier(src))

    with pytest.raises(TransferError, match="different temporary files"):
        write_range(task(src, dst), "7", FileRange(0, 2, "0000abcd"), copy_while_swept)
    assert dst.read_bytes() == b"the old file"


def test_ranges_planned_from_different_versions_of_the_source_never_land(
    tmp_path: Path, src: Path
) -> None:
    """Each node plans the file itself: one saw it before it was replaced, one after."""
    dst = tmp_path / "out"
    write_range(task(src, dst), "7", FileRange(0, 2, "0000abcd"), copier(src))
    newer = FileTask(str(src), str(dst), "file", SIZE, 0o640, 1_700_000_000_000_000_000)
    with pytest.raises(TransferError, match="different versions of the source") as err:
        write_range(newer, "7", FileRange(1, 2, "0000abcd"), copier(src))
    assert not err.value.permanent and not dst.exists()
