"""Names up to NAME_MAX can be staged (audit #16): a temporary name adds ~40 bytes to the
file's name, so a long one is cut and hashed in the temporary name, and every piece that
finds a file's temporary files again (the worker's bookkeeping, leftovers) follows."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from bbstage.movers import FileTask, MoverOptions, localfs
from bbstage.movers.implementations.posix import PosixMover
from bbstage.transfer import TempFile, TempsSettled, TransferSpec, worker
from tests.helpers import Conn, Sink, file_digest

LONG = "é" * 100 + "x" * 50  # 250 bytes in UTF-8, 150 characters


def test_a_250_byte_name_is_staged_through_a_named_temporary_file(tmp_path: Path) -> None:
    assert len(os.fsencode(LONG)) == 250
    src = tmp_path / LONG
    src.write_bytes(os.urandom(3 << 20))  # >= 1 MiB: a named .part file
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / LONG).write_bytes(b"old")  # and an overwrite
    sink = Sink()
    task = FileTask(str(src), str(dst / LONG), "file", 3 << 20, 0o644, follow=True)
    PosixMover(MoverOptions(job_id="12345678901")).copy(task, sink, threading.Event())
    assert file_digest(dst / LONG) == file_digest(src)
    assert sink.temps and all(len(os.fsencode(os.path.basename(t))) <= 255 for t in sink.temps)
    assert os.listdir(dst) == [LONG]
    assert {localfs.temp_owner(t) for t in sink.temps} == {localfs.temp_key(task.dst)}
    assert localfs.temp_pattern("12345678901").match(os.path.basename(sink.temps[0]))


def test_the_worker_settles_a_long_names_temporary_file(tmp_path: Path) -> None:
    """Through the worker: the file lands and its temporary file is told settled (so the
    executor does not keep it, nor remove it after the rename)."""
    src = tmp_path / LONG
    src.write_bytes(os.urandom(2 << 20))
    conn = Conn()
    spec = TransferSpec.between(str(src), str(tmp_path / "o" / LONG), job_id="7")
    worker.transfer(spec, worker.Reporter(conn), threading.Event())  # type: ignore[arg-type]
    assert file_digest(tmp_path / "o" / LONG) == file_digest(src)
    made = [e.path for e in conn.events if isinstance(e, TempFile)]
    settled = [p for e in conn.events if isinstance(e, TempsSettled) for p in e.paths]
    assert made and settled == made
