"""Only regular files are copied (#36 item 3): a FIFO, socket or device named as a single
source fails at once, naming it; inside a tree such entries are skipped and counted, as
rsync does, and the rest is copied. No open of a source ever blocks."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bbstage.cli import render
from bbstage.config import Config
from bbstage.daemon import report
from bbstage.daemon.engine import Engine
from bbstage.daemon.state import Store
from bbstage.movers import FileTask, MoverOptions, TransferError, localfs
from bbstage.movers.implementations.posix import PosixMover
from bbstage.transfer import Done, Failed, Planned, TransferSpec, walkproc, worker
from tests.helpers import Conn, Sink, file_digest, run_worker, tree_digests
from tests.unit.test_engine import FakeExecutor, ask, setup

BLOCKS = 5.0  # seconds: an open that blocks on a FIFO with no writer takes for ever


def in_time(call: Any, seconds: float = BLOCKS) -> Any:
    """``call()``'s result, or a failure if it has not returned within ``seconds`` (a thread
    blocked in ``open`` of a FIFO stays so: it is left behind, a daemon thread)."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(("ok", call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"still blocked after {seconds} s"
    return result[0]


@pytest.fixture
def specials(tmp_path: Path) -> Iterator[list[str]]:
    """A FIFO, a listening Unix socket and a character device (like /dev/null) in
    ``tmp_path/src/sub`` beside regular files; their names."""
    sub = tmp_path / "src" / "sub"
    sub.mkdir(parents=True)
    (tmp_path / "src" / "a.dat").write_bytes(os.urandom(10_000))
    (sub / "b.dat").write_bytes(os.urandom(3_000_000))
    (sub / "c.dat").write_bytes(b"")
    os.mkfifo(sub / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sub / "sock"))
    sock.listen()
    os.mknod(sub / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # as root: /dev/null's
    yield ["fifo", "sock", "null"]
    sock.close()


def spec(src: Path | str, dst: Path | str, **kw: Any) -> TransferSpec:
    return TransferSpec.between(str(src), str(dst), job_id="36", **kw)


def outcome(conn: Conn) -> Done | Failed | None:
    ends = [e for e in conn.events if isinstance(e, Done | Failed)]
    return ends[-1] if ends else None


def final(conn: Conn) -> Planned:
    return [e for e in conn.events if isinstance(e, Planned) and e.final][-1]


@pytest.mark.parametrize("kind", ["FIFO", "socket", "character device"])
def test_a_single_special_source_fails_at_once_naming_it(
    tmp_path: Path, specials: list[str], kind: str
) -> None:
    name = {"FIFO": "fifo", "socket": "sock", "character device": "null"}[kind]
    src = tmp_path / "src" / "sub" / name
    conn = Conn()
    started = time.monotonic()
    status, _ = in_time(
        lambda: worker.transfer(
            spec(src, tmp_path / "out"),
            worker.Reporter(conn),  # type: ignore[arg-type]
            threading.Event(),
        )
    )
    assert status == "ok" and time.monotonic() - started < 2
    end = outcome(conn)
    assert isinstance(end, Failed) and end.permanent
    assert end.message == f"not a regular file: {src} is a {kind}; only regular files are staged"
    assert not any(isinstance(e, Planned) for e in conn.events)  # refused by the plan
    assert not (tmp_path / "out").exists()


def test_specials_in_a_tree_are_skipped_counted_and_the_rest_copied(
    tmp_path: Path, specials: list[str]
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    conn = in_time(lambda: run_worker(spec(f"{src}/", f"{dst}/")))[1]
    assert final(conn) == Planned(10_000 + 3_000_000, 3, skipped=3)
    assert tree_digests(dst) == {
        k: v for k, v in tree_digests(src).items() if os.path.basename(k) not in specials
    }
    assert sorted(os.listdir(dst / "sub")) == ["b.dat", "c.dat"]


def test_specials_in_a_tree_walked_apart_are_counted(
    tmp_path: Path, specials: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big tree is walked in a process of its own (``bbstage.transfer.walkproc``): the count comes
    back through its frames."""
    monkeypatch.setattr(walkproc, "MANY", 2)
    src, dst = tmp_path / "src", tmp_path / "dst"
    conn = in_time(lambda: run_worker(spec(f"{src}/", f"{dst}/")))[1]
    assert final(conn) == Planned(10_000 + 3_000_000, 3, skipped=3)
    assert file_digest(dst / "sub" / "b.dat") == file_digest(src / "sub" / "b.dat")


def test_a_fifo_swapped_in_after_the_walk_is_never_opened_blocking(tmp_path: Path) -> None:
    """The copy's own open: a FIFO where the walk saw a file (``O_NONBLOCK``, ``fstat``)."""
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    mover = PosixMover(MoverOptions(job_id="36", checksum="xxh3"))
    task = FileTask(str(fifo), str(tmp_path / "out"), "file", 5)
    status, exc = in_time(lambda: mover.copy(task, Sink(), threading.Event()))
    assert status == "raised" and isinstance(exc, TransferError) and exc.permanent
    assert str(exc) == f"not a regular file: {fifo} is a FIFO; only regular files are staged"
    status, exc = in_time(lambda: mover.prefetch(task))  # a hint: says nothing, never blocks
    assert status == "ok"


def test_open_source_refuses_a_link_in_a_tree_and_follows_a_named_one(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"data")
    (tmp_path / "l").symlink_to(tmp_path / "f")
    with pytest.raises(TransferError, match="refusing to follow a symbolic link"):
        localfs.open_source(str(tmp_path / "l"))
    fd = localfs.open_source(str(tmp_path / "l"), follow=True)
    try:
        assert os.read(fd, 10) == b"data"
        assert os.get_blocking(fd)  # O_NONBLOCK cleared again
    finally:
        os.close(fd)


def test_status_shows_the_special_files_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From the worker's count to ``bbstage status`` (and ``--json``): through the engine and
    the state database."""
    store = Store(tmp_path / "state.db")
    executor = FakeExecutor()
    config = Config(socket=tmp_path / "run" / "control.sock")
    engine = Engine(config, store, executor)
    executor.outcomes = [(Planned(7, 1, skipped=3), Done(7, 1))]
    setup(engine, "9", f"stage_in source={tmp_path}/src/ destination={tmp_path}/dst/")
    assert ask(engine, "data_in", job_id="9") == ("ok", "")
    job = store.job("9")
    assert job is not None
    shown = report.job_status(job)
    assert shown["directives"][0]["files_skipped"] == 3
    render.status(shown)
    assert "1/1 files (3 special files skipped)" in capsys.readouterr().out
    store.close()


def test_an_upload_to_s3_skips_and_counts_them_too(
    tmp_path: Path, specials: list[str], endpoint: str, client: Any, bucket: str
) -> None:
    """A tree uploaded to S3 (links to files followed; a link to a FIFO is skipped too)."""
    from tests.unit.test_s3_mover import run

    (tmp_path / "src" / "to-fifo").symlink_to(tmp_path / "src" / "sub" / "fifo")
    conn = in_time(lambda: run(f"{tmp_path}/src/", f"s3://{bucket}/t/", endpoint), 30)[1]
    assert final(conn) == Planned(10_000 + 3_000_000, 3, skipped=4)
    listed = client.list_objects_v2(Bucket=bucket, Prefix="t/")["Contents"]
    assert sorted(o["Key"] for o in listed) == ["t/a.dat", "t/sub/b.dat", "t/sub/c.dat"]
    body = client.get_object(Bucket=bucket, Key="t/sub/b.dat")["Body"].read()
    assert body == (tmp_path / "src" / "sub" / "b.dat").read_bytes()
