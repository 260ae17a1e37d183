"""The worker's transfer loop: planning, skipping what is staged, retries, overwrite policy."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from bbstage.movers import FileTask, Mover, MoverOptions, TransferError, retrying
from bbstage.transfer import Planned, ScratchLimit, TransferSpec, worker
from tests.helpers import Conn, run_worker


def spec(src: Path | str, dst: Path | str, **kw: Any) -> TransferSpec:
    return TransferSpec.between(str(src), str(dst), job_id="7", **kw)


def test_many_small_files_and_plan_event(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(200):
        (src / f"f{i}").write_bytes(b"x" * i)
    conn = run_worker(spec(f"{src}/", f"{tmp_path}/dst/"))
    assert Planned(sum(range(200)), 200) in conn.events
    assert len(list((tmp_path / "dst").iterdir())) == 200


def test_second_run_skips_what_is_staged(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("hello")
    run_worker(spec(tmp_path / "f", tmp_path / "g"))
    conn = run_worker(spec(tmp_path / "f", tmp_path / "g"))
    assert Planned(0, 0) in conn.events


def test_overwrite_never_keeps_an_existing_file(tmp_path: Path) -> None:
    """docs/directives.md: ``never`` keeps (skips) an existing destination file."""
    (tmp_path / "f").write_text("new")
    (tmp_path / "g").write_text("old!")
    (tmp_path / "h").unlink(missing_ok=True)
    conn = run_worker(spec(tmp_path / "f", tmp_path / "g", overwrite="never"))
    assert Planned(0, 0) in conn.events
    assert (tmp_path / "g").read_text() == "old!"
    run_worker(spec(tmp_path / "f", tmp_path / "h", overwrite="never"))
    assert (tmp_path / "h").read_text() == "new"


def test_transient_errors_are_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retrying, "FILE", retrying.RetryPolicy(tries=6))  # no waits
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TransferError("connection reset", permanent=False)
        return "ok"

    assert retrying.FILE.run(flaky, threading.Event()) == "ok"
    assert len(calls) == 3


def test_permanent_errors_are_not_retried() -> None:
    calls = []

    def denied() -> None:
        calls.append(1)
        raise PermissionError(13, "Permission denied", "/secret")

    with pytest.raises(TransferError, match="permission denied: /secret"):
        retrying.FILE.run(denied, threading.Event())
    assert len(calls) == 1


def test_scratch_capacity_is_enforced(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 5000)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "already").write_bytes(b"y" * 1000)
    limit = ScratchLimit(str(scratch), 5500)
    with pytest.raises(TransferError, match="needs 5000 bytes, 1000 of capacity=5500"):
        run_worker(spec(tmp_path / "big", scratch / "big", scratch_limit=limit))
    assert not (scratch / "big").exists()
    run_worker(
        spec(tmp_path / "big", scratch / "big", scratch_limit=ScratchLimit(str(scratch), 6000))
    )
    assert (scratch / "big").stat().st_size == 5000


class Recording(Mover):
    """Copies nothing; logs the order of its prefetch and copy calls."""

    def __init__(self) -> None:
        super().__init__(MoverOptions())
        self.log: list[tuple[str, int]] = []

    def plan(self, src: str, dst: str, *, tree: bool, glob: bool) -> list[FileTask]:
        return []

    def current(self, task: FileTask) -> bool | None:
        return None

    def copy(self, task: FileTask, progress: Any, cancel: threading.Event) -> None:
        self.log.append(("copy", int(task.src)))

    def prefetch(self, task: FileTask) -> None:
        self.log.append(("prefetch", int(task.src)))


def test_read_ahead_covers_files_within_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "READ_AHEAD_FILES", 16)
    mover = Recording()
    tasks = [FileTask(str(i), f"/d/{i}", "file", 10) for i in range(300)]
    reporter = worker.Reporter(Conn())  # type: ignore[arg-type]
    worker._copy_all(mover, tasks, reporter, threading.Event(), threads=1)
    assert [i for kind, i in mover.log if kind == "copy"] == list(range(300))
    copying = -1
    for kind, i in mover.log:
        if kind == "copy":
            copying = i
        else:
            assert i - copying <= 16 + 1, "read further ahead than its window"
    assert len([i for kind, i in mover.log if kind == "prefetch"]) > 0


def test_a_resumed_transfer_removes_its_stale_temp_files(tmp_path: Path) -> None:
    """I3: a killed attempt's ``.part`` files go when the transfer runs again."""
    (tmp_path / "f").write_text("x")
    dst = tmp_path / "d"
    dst.mkdir()
    stale = dst / ".g.bbstage-7-0123abcd.part"
    stale.write_text("partial")
    others = dst / ".g.bbstage-8-0123abcd.part"  # another job's: not ours to remove
    others.write_text("partial")
    run_worker(spec(tmp_path / "f", dst / "g"))
    assert stale.exists()
    run_worker(spec(tmp_path / "f", dst / "g", resumed=True))
    assert not stale.exists() and others.exists()
    assert (dst / "g").read_text() == "x"


def test_select_looks_up_only_entries_of_directories_that_exist(tmp_path: Path) -> None:
    """``planning.select`` skips the per-file lookup under a directory found absent, and only
    there: a partly staged tree still skips its current files and keeps (``never``) the rest."""
    from bbstage.movers.implementations.posix import PosixMover
    from bbstage.transfer import planning

    src = tmp_path / "src"
    for d in ("a", "a/sub", "b"):
        (src / d).mkdir(parents=True)
        for i in range(3):
            (src / d / f"f{i}").write_text(f"{d}{i}")
    dst = tmp_path / "dst"

    class Counting(PosixMover):
        looked: list[str] = []

        def current(self, task: FileTask) -> bool | None:
            self.looked.append(task.dst)
            return super().current(task)

    def plan(mover: Mover, overwrite: str = "always") -> list[FileTask]:
        tasks = mover.plan(f"{src}/", f"{dst}/", tree=True, glob=False)
        chosen = []
        for task in planning.select(mover, tasks, overwrite):
            if task.kind == "dir":
                mover.copy(task, Conn(), threading.Event())  # as the walk makes them
            chosen.append(task)
        return chosen

    fresh = Counting(MoverOptions())
    assert len(plan(fresh)) == 13  # 4 directories, 9 files
    assert fresh.looked == [str(dst)]  # the root only: nothing below an absent directory

    shutil.rmtree(dst)
    run_worker(spec(f"{src}/a/", f"{dst}/a/"))  # a/ staged, b/ not yet
    (dst / "a" / "f1").write_text("kept")
    again = Counting(MoverOptions())
    again.looked = []
    chosen = {t.dst for t in plan(again, "never") if t.kind == "file"}
    assert chosen == {str(dst / "b" / f"f{i}") for i in range(3)}
    assert (dst / "a" / "f1").read_text() == "kept"
    assert not any(path.startswith(str(dst / "b") + "/") for path in again.looked)
    assert len(again.looked) == 10  # the root, a, b, a's 4 entries, a/sub's 3 files
