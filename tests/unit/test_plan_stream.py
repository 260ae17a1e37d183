"""The streamed plan (issue 17, goal 2): a tree is walked as it is copied, never held whole;
``Planned`` is final only when the walk has ended, before ``Done``, and the engine trusts
only a final one; the executor keeps only the temporary files not yet settled, and every one
that exists on disk is among them; a tree that changes while it is walked breaks nothing."""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from bbstage.movers import FileTask, Mover, MoverOptions
from bbstage.movers.implementations import posix
from bbstage.transfer import (
    Done,
    Failed,
    Planned,
    TempFile,
    TransferSpec,
    planning,
    track_temps,
    walkproc,
    worker,
)
from tests.helpers import Conn, file_digest, make_tree, tree_digests
from tests.unit.test_engine import ask, engine, outcomes, setup, states

__all__ = ["engine"]  # fixture


def spec(src: Path | str, dst: Path | str, **kw: Any) -> TransferSpec:
    return TransferSpec.between(str(src), str(dst), job_id="7", **kw)


def transfer(s: TransferSpec, conn: Any = None) -> list[Any]:
    """Run one transfer as a worker does, outcome included; the events it sent."""
    conn = conn or Conn()
    worker.transfer(s, worker.Reporter(conn), threading.Event())
    return conn.events  # type: ignore[no-any-return]


class Lazy(Mover):
    """A plan of ``n`` files made one at a time; counts how far the walk ran ahead."""

    def __init__(self, n: int) -> None:
        super().__init__(MoverOptions())
        self.n, self.made, self.copied, self.ahead = n, 0, 0, 0

    def plan(self, src: str, dst: str, *, tree: bool, glob: bool) -> Any:
        for i in range(self.n):
            self.made += 1
            self.ahead = max(self.ahead, self.made - self.copied)
            yield FileTask(str(i), f"/d/{i}", "file", 10)

    def current(self, task: FileTask) -> bool | None:
        return None

    def copy(self, task: FileTask, progress: Any, cancel: threading.Event) -> None:
        self.copied += 1


def test_the_walk_runs_a_bounded_window_ahead_of_the_copy() -> None:
    mover = Lazy(30_000)
    reporter = worker.Reporter(Conn())  # type: ignore[arg-type]
    worker._copy_all(mover, mover.plan("", "", tree=True, glob=False), reporter,
                     threading.Event(), threads=1)  # fmt: skip
    assert mover.copied == 30_000
    assert mover.ahead <= worker.READ_AHEAD_FILES + 1, "the plan was read further ahead"


def test_planned_is_final_once_the_walk_ended_and_before_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(planning, "REPORT_EVERY", 0.0)  # the counts so far at every chunk
    monkeypatch.setattr(walkproc, "MANY", 10**9)  # walked by a thread, which sees the 0.0
    src = make_tree(tmp_path / "src", 3000, 10, sub="s")
    events = transfer(spec(f"{src}/", f"{tmp_path}/dst/"))
    plans = [e for e in events if isinstance(e, Planned)]
    assert [p.final for p in plans] == [False] * (len(plans) - 1) + [True]
    assert len(plans) > 2, "no counts while walking"
    assert all(a.files <= b.files and a.bytes <= b.bytes for a, b in itertools.pairwise(plans))
    assert plans[-1] == Planned(30_000, 3000)
    assert events[-1] == Done(30_000, 3000)
    assert events.index(plans[-1]) < len(events) - 1
    assert tree_digests(tmp_path / "dst") == tree_digests(src)


def test_the_engine_trusts_only_a_final_plan(engine: Any) -> None:
    """A Done that matches the counts of a walk still under way is no proof: not done."""
    setup(engine, "5", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(300, 3, final=False), Done(300, 3)))
    status, message = ask(engine, "data_in", job_id="5")
    assert status == "error" and "of the ? files" in message
    assert states(engine, "5") == ["failed"]


class Checking(Conn):
    """The executor's bookkeeping of temporary files, checked against the disk as the
    worker reports: every temporary file that exists is one the executor keeps."""

    def __init__(self, dst: Path) -> None:
        super().__init__()
        self.dst, self.temps, self.most, self.checks = dst, set[str](), 0, 0

    def send(self, event: Any) -> None:
        super().send(event)
        track_temps(self.temps, event)
        self.most = max(self.most, len(self.temps))
        if isinstance(event, TempFile) and len(self.events) % 7 == 0:
            self.checks += 1
            on_disk = {str(p) for p in self.dst.rglob("*.part")}
            assert on_disk <= self.temps, f"not kept by the executor: {on_disk - self.temps}"


def test_the_executor_keeps_only_the_temp_files_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Overwriting 2000 files makes 2000 named temporary files (each linked in place over
    the old file); the executor never keeps more than a batch of them, and at every check
    each one on disk is among those it keeps (a killed worker's are removed)."""
    monkeypatch.setattr(worker, "SETTLE_BATCH", 50)
    monkeypatch.setattr(posix, "_on_block_device", lambda path: False)  # 8 threads
    src = make_tree(tmp_path / "src", 2000, 100, sub="s")
    old = make_tree(tmp_path / "dst", 2000, 99, sub="s")
    conn = Checking(old)
    events = transfer(spec(f"{src}/", f"{tmp_path}/dst/", threads=8), conn)
    assert events[-1] == Done(200_000, 2000)
    assert len([e for e in events if isinstance(e, TempFile)]) == 2000
    assert conn.checks > 100
    assert conn.most <= 50 + 8 + 1, f"kept {conn.most} temporary files"
    assert conn.temps == set()
    assert tree_digests(old) == tree_digests(src)


@pytest.mark.parametrize("apart", [False, True], ids=["walk-thread", "walk-process"])
def test_a_tree_that_changes_while_it_is_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, apart: bool
) -> None:
    """Files added where the walk has not been yet are staged, those added where it has
    been are not; either way the manifest covers the final plan and every staged file
    holds its source's bytes, with no temporary file left. The walk runs in a thread or in
    a process of its own (``bbstage.transfer.walkproc``); the copy, a window behind it, adds
    them."""
    monkeypatch.setattr(worker, "READ_AHEAD_FILES", 32)  # the walk stays close to the copy
    monkeypatch.setattr(walkproc, "MANY", 0 if apart else 10**9)
    src = tmp_path / "src"
    for name in ("a", "b", "c"):
        make_tree(src / name, 200, 1000, fill="rotated")
    copy, order = posix.PosixMover.copy, []

    def changing(self: Any, task: FileTask, progress: Any, cancel: threading.Event) -> None:
        if task.kind == "file":
            order.append(Path(task.src).parent.name)
            if len(order) == 250:  # the walk is in the second directory it reads
                for name in ("a", "b", "c"):
                    (src / name / "late").write_bytes(os.urandom(3000))
        copy(self, task, progress, cancel)

    monkeypatch.setattr(posix.PosixMover, "copy", changing)
    events = transfer(spec(f"{src}/", f"{tmp_path}/dst/"))
    final = [e for e in events if isinstance(e, Planned) and e.final]
    assert len(final) == 1 and isinstance(events[-1], Done)
    assert events[-1].files == final[0].files and events[-1].bytes == final[0].bytes
    staged = tree_digests(tmp_path / "dst")
    for rel, digest in staged.items():
        assert file_digest(src / rel) == digest, rel
    first, last = order[0], order[-1]
    assert f"{first}/late" not in staged  # its directory was read before the file came
    assert f"{last}/late" in staged  # read after it came
    assert final[0].files == len(staged) == 600 + len([d for d in "abc" if f"{d}/late" in staged])
    assert list((tmp_path / "dst").rglob("*.part")) == []


def test_a_file_removed_after_it_was_walked_fails_the_transfer_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree(tmp_path / "src", 400, 1000)
    copy = posix.PosixMover.copy

    def vanishing(self: Any, task: FileTask, progress: Any, cancel: threading.Event) -> None:
        if task.src.endswith("f00300"):
            os.unlink(task.src)  # walked (it is in the plan), gone before its copy
        copy(self, task, progress, cancel)

    monkeypatch.setattr(posix.PosixMover, "copy", vanishing)
    events = transfer(spec(f"{src}/", f"{tmp_path}/dst/"))
    assert isinstance(events[-1], Failed) and "no such file" in events[-1].message
    assert not any(isinstance(e, Done) for e in events)
    assert list((tmp_path / "dst").rglob("*.part")) == []
