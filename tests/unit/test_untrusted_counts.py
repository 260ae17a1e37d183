"""Sizes and counts from untrusted sources (audit #12): an S3 server's listing ``Size`` and
``Content-Length`` are checked as they are read; sparse files that add up past 2**63-1 fail
their transfer; the engine keeps every count an executor reports within what SQLite stores;
its progress recorder outlives a value it cannot save, and a transfer whose end cannot be
recorded is failed, never left ``running``."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from bbstage.daemon.engine import Engine
from bbstage.daemon.transfers import Running
from bbstage.movers import FileTask, Mover, TransferError, counts
from bbstage.movers.implementations.s3 import head, listing
from bbstage.movers.implementations.s3.download import S3Download
from bbstage.protocol import Request
from bbstage.transfer import Done, Planned
from bbstage.transfer.planning import Walk
from tests.helpers import wait_until_async
from tests.unit.test_engine import ask, engine, outcomes, setup, states
from tests.unit.test_s3_listing import _Fast

__all__ = ["engine"]  # the fixture

BAD = ["9223372036854775808", "-1", "1e3", "٣", "18446744073709551616"]


def page(size: str) -> bytes:
    return (
        b"<ListBucketResult><Contents><Key>k</Key><Size>" + size.encode() + b"</Size>"
        b"<ETag>e</ETag></Contents></ListBucketResult>"
    )


@pytest.mark.parametrize("size", BAD)
def test_a_listed_size_out_of_range_is_refused_naming_the_key(size: str) -> None:
    with pytest.raises(TransferError, match="listed key 'k'.*not a size in 0 .. 2\\*\\*63-1"):
        listing.parse(page(size))
    assert listing.parse(page(str(counts.MAX)))["Contents"][0]["Size"] == counts.MAX


class _Lengths(http.server.BaseHTTPRequestHandler):
    length = "0"

    def do_HEAD(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", self.length)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def lengths() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Lengths)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("length", ["9223372036854775808", "-5"])
def test_a_content_length_out_of_range_is_refused_naming_the_object(
    lengths: str, length: str
) -> None:
    _Lengths.length = length
    fast = _Fast(lengths)
    with pytest.raises(TransferError, match="s3://b/k: the server gave its size as"):
        asyncio.run(head.DirectHead(fast).head("b", "k"))  # type: ignore[arg-type]
    _Lengths.length = "12"
    assert asyncio.run(head.DirectHead(fast).head("b", "k"))["ContentLength"] == 12  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [1 << 63, -1])
def test_a_download_plans_no_size_out_of_range(size: int) -> None:
    """botocore's own parse gives an int of any size: the download's plan checks it too."""
    mover = SimpleNamespace(settings=SimpleNamespace(file_mode=0o644))
    with pytest.raises(TransferError, match="s3://b/k: the server gave its size as"):
        S3Download._file(mover, "s3://b/k", "/d/k", size, None)  # type: ignore[arg-type]


class _NoPrefetch:
    prefetch = Mover.prefetch


def test_files_that_add_up_past_what_sqlite_holds_fail_their_walk() -> None:
    """Three sparse files of 2**62 bytes each: the plan's sum would be 1.5 * 2**63."""
    tasks = [FileTask(f"/s/{i}", f"/d/{i}", "file", 1 << 62) for i in range(3)]
    sent: list[Any] = []
    walk = Walk(_NoPrefetch(), tasks, sent.append, threading.Event(), make_dir=None,  # type: ignore[arg-type]
                budget=None, files_ahead=1000, bytes_ahead=1 << 80)  # fmt: skip
    with pytest.raises(TransferError, match="add up to .* bytes at /s/1, over 2\\*\\*63-1"):
        walk.walk()
    assert all(p.bytes <= counts.MAX for p in sent)


def test_an_executors_count_past_what_sqlite_holds_is_saved_within_range(engine: Engine) -> None:
    """The Dask executor sums its shards' counts in root: a sum past 2**63-1 is progress the
    recorder saves (as the most SQLite holds), not a value that makes it raise."""
    setup(engine, "70", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(1 << 64, 2), None))  # runs until cancelled

    async def scenario() -> None:
        recording = asyncio.create_task(engine.record_progress())
        await engine.handle(Request("data_in", {"job_id": "70", "wait": False}))

        def saved() -> bool:
            job = engine.store.job("70")
            return job is not None and job.directives[0].bytes_total == counts.MAX

        await wait_until_async(saved, 3, "the clamped plan in the state")
        recording.cancel()

    asyncio.run(scenario())


def test_the_progress_recorder_outlives_a_value_it_cannot_save(engine: Engine) -> None:
    """A count SQLite refuses (any bad value that got this far) is logged and skipped: the
    recorder goes on saving everyone else's progress."""
    setup(engine, "71", "stage_in source=/a/ destination=/b/")
    setup(engine, "72", "stage_in source=/a/ destination=/b/")

    async def scenario() -> None:
        recording = asyncio.create_task(engine.record_progress())
        # A running transfer's counts, as if a bad one had got through.
        engine._running[("71", 0)] = Running(counts={"bytes_total": 1 << 64})
        await asyncio.sleep(1.5)  # the recorder met it
        assert not recording.done(), recording.exception()
        outcomes(engine).append((Planned(5, 1), None))
        await engine.handle(Request("data_in", {"job_id": "72", "wait": False}))

        def saved() -> bool:
            job = engine.store.job("72")
            return job is not None and job.directives[0].bytes_total == 5

        await wait_until_async(saved, 3, "job 72's plan in the state")
        recording.cancel()

    asyncio.run(scenario())


def test_a_transfer_whose_end_cannot_be_recorded_is_failed_not_left_running(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup(engine, "73", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(10, 1), Done(10, 1)))
    real = engine.store.set_directive

    def refuse_done(job_id: str, idx: int, **fields: Any) -> None:
        if fields.get("state") == "done":
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        real(job_id, idx, **fields)

    monkeypatch.setattr(engine.store, "set_directive", refuse_done)
    status, message = ask(engine, "data_in", job_id="73")
    assert states(engine, "73") == ["failed"]
    assert status == "error" and "internal error while recording the transfer's end" in message
    job = engine.store.job("73")
    assert job is not None and job.state == "failed"
