"""localfs.preallocate: a file's blocks given at once where the file system can; never
emulated; a disk too small is an error."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest

from bbstage.movers import localfs

SIZE = 8 << 20


def sparse(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, SIZE)
    return fd


class Failing:
    """A fake ``fallocate`` that fails with ``codes`` in turn, then succeeds."""

    def __init__(self, *codes: int) -> None:
        self.codes, self.calls = list(codes), 0

    def __call__(self, fd: int, mode: int, offset: int, length: int) -> int:
        self.calls += 1
        if self.codes:
            ctypes.set_errno(self.codes.pop(0))
            return -1
        return 0


def test_the_file_gets_its_blocks_and_reads_as_zeros(tmp_path: Path) -> None:
    fd = sparse(tmp_path / "f")
    try:
        assert os.fstat(fd).st_blocks == 0
        localfs.preallocate(fd, SIZE)
        st = os.fstat(fd)
        assert st.st_blocks * 512 >= SIZE and st.st_size == SIZE
        assert os.pread(fd, SIZE, 0) == bytes(SIZE)
    finally:
        os.close(fd)


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.ENOSYS])
def test_a_file_system_without_it_is_left_to_allocate_as_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    fake = Failing(code)
    monkeypatch.setattr(localfs, "_fallocate", fake)
    fd = sparse(tmp_path / "f")
    try:
        localfs.preallocate(fd, SIZE)
        assert fake.calls == 1 and os.fstat(fd).st_blocks == 0  # not emulated with zeros
    finally:
        os.close(fd)


def test_no_space_is_an_error_and_an_interruption_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fd = sparse(tmp_path / "f")
    try:
        fake = Failing(errno.EINTR, errno.ENOSPC)
        monkeypatch.setattr(localfs, "_fallocate", fake)
        with pytest.raises(OSError) as caught:
            localfs.preallocate(fd, SIZE)
        assert caught.value.errno == errno.ENOSPC and fake.calls == 2
        fake = Failing(errno.EINTR)
        monkeypatch.setattr(localfs, "_fallocate", fake)
        localfs.preallocate(fd, SIZE)
        assert fake.calls == 2
    finally:
        os.close(fd)
