"""The state store: jobs and their directives, selected by state in a fixed number of queries."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bbstage.daemon.state import Store
from bbstage.movers import Registry


def directive(index: int) -> dict[str, object]:
    return {"index": index, "line": 2 + index, "verb": "stage_in", "source": f"/s{index}",
            "destination": f"/d{index}"}  # fmt: skip


# The legal moves (bbstage.daemon.state.MOVES) from setup to each state these tests use.
PATHS = {"setup": [], "running": ["staging_in", "staged_in", "running"], "done": ["done"],
         "failed": ["failed"]}  # fmt: skip


def store_with_jobs(tmp_path: Path) -> Store:
    store = Store(tmp_path / "state.db")
    for n, state in enumerate(["setup", "running", "done", "failed", "running"]):
        job_id = str(100 + n)
        store.create_job(job_id, uid=1000, gid=1000, pool="scratch", size=0, scratch=None,
                         directives=[directive(i) for i in range(n)])  # fmt: skip
        for step in PATHS[state]:
            store.set_job(job_id, state=step)
    return store


def test_jobs_by_state_with_their_directives(tmp_path: Path) -> None:
    store = store_with_jobs(tmp_path)
    running = store.jobs(("running",))
    assert [j.job_id for j in running] == ["101", "104"]
    assert [[d.idx for d in j.directives] for j in running] == [[0], [0, 1, 2, 3]]
    assert [d.source for d in running[1].directives] == ["/s0", "/s1", "/s2", "/s3"]
    assert [j.job_id for j in store.jobs()] == ["100", "101", "102", "103", "104"]
    assert store.jobs(()) == []
    assert store.jobs(("running",))[1].directives == store.job("104").directives  # type: ignore[union-attr]


def test_jobs_of_a_user_are_selected_in_sql_on_a_connection_of_their_own(tmp_path: Path) -> None:
    """``bbstage jobs``: a user's own jobs only (all for None), read while the daemon's own
    connection is held (its lock taken, as by a write in progress)."""
    store = store_with_jobs(tmp_path)
    store.create_job("200", uid=1001, gid=1001, pool=None, size=0, scratch=None,
                     directives=[directive(0)])  # fmt: skip
    read: dict[int | None, list[Any]] = {}

    def jobs_of() -> None:
        for uid in (1000, 1001, None):
            read[uid] = store.jobs_of(uid)

    with store._lock:
        reader = threading.Thread(target=jobs_of)
        reader.start()
        reader.join(10)
        assert not reader.is_alive(), "jobs_of waited for the daemon's own connection"
    mine, theirs, every = read[1000], read[1001], read[None]
    assert [j.job_id for j in mine] == ["100", "101", "102", "103", "104"]
    assert [[d.idx for d in j.directives] for j in mine] == [
        [],
        [0],
        [0, 1],
        [0, 1, 2],
        [0, 1, 2, 3],
    ]
    assert [(j.job_id, j.uid) for j in theirs] == [("200", 1001)]
    assert [j.job_id for j in every] == [j.job_id for j in store.jobs()]
    assert store.jobs_of(4242) == []
    store.close()


def test_jobs_updated_since(tmp_path: Path) -> None:
    store = store_with_jobs(tmp_path)
    cutoff = store.job("104").updated  # type: ignore[union-attr]
    store.set_job("101", error="")  # updated again: after the cutoff
    assert [j.job_id for j in store.jobs(("running",), updated_since=cutoff)] == ["101", "104"]
    later = store.job("101").updated + 1  # type: ignore[union-attr]
    assert store.jobs(updated_since=later) == []
    assert [j.job_id for j in store.jobs(("done",), updated_since=0)] == ["102"]


def test_counts(tmp_path: Path) -> None:
    assert store_with_jobs(tmp_path).counts() == {"setup": 1, "running": 2, "done": 1, "failed": 1}


def test_finished_before(tmp_path: Path) -> None:
    store = store_with_jobs(tmp_path)
    finished = ("done", "failed", "cancelled")
    assert store.finished_before(time.time() - 60, finished) == []
    later = time.time() + 1
    assert sorted(store.finished_before(later, finished)) == [
        ("102", "scratch"),
        ("103", "scratch"),
    ]


def test_job_reads_its_writes_and_leaves_earlier_rows_alone(tmp_path: Path) -> None:
    store = store_with_jobs(tmp_path)
    before = store.job("104")
    assert before is not None and before is store.job("104")  # answered from memory
    store.set_job("104", state="staging_out")
    store.set_directive("104", 2, state="running")
    store.set_directive("104", 2, state="done", bytes_done=7)
    after = store.job("104")
    assert after is not None and after.state == "staging_out"
    assert [(d.state, d.bytes_done) for d in after.directives][1:3] == [("pending", 0), ("done", 7)]
    assert before.state == "running" and before.directives[2].state == "pending"
    # What memory says is what the database says.
    fresh = Store(tmp_path / "state.db").job("104")
    assert fresh == after
    store.delete_job("104")
    assert store.job("104") is None


def test_a_failed_write_drops_the_copy_in_memory(tmp_path: Path) -> None:
    store = store_with_jobs(tmp_path)
    assert store.job("101") is not None
    with pytest.raises(sqlite3.Error):
        store.set_job("101", no_such_column=1)
    assert store.job("101") == Store(tmp_path / "state.db").job("101")
    store.create_job("101", uid=1, gid=1, pool=None, size=0, scratch=None, directives=[])
    assert store.job("101").state == "setup" and store.job("101").directives == []  # type: ignore[union-attr]


def test_a_created_job_in_memory_is_the_one_on_disk(tmp_path: Path) -> None:
    from bbstage import directives

    parsed = directives.parse(
        "#!/bin/bash\n#BB_LUA pool=scratch capacity=1M\n"
        "#BB_LUA stage_in source=/a/b destination=$BB_SCRATCH/b checksum=xxh3\n"
        "#BB_LUA stage_out source=$BB_SCRATCH/out/ destination=s3://bucket/out/\n",
        Registry(),
    )
    assert not parsed["errors"]
    store = Store(tmp_path / "state.db")
    made = store.create_job(
        "7",
        uid=1000,
        gid=1000,
        pool="scratch",
        size=1 << 20,
        scratch="/s/7",
        directives=parsed["directives"],
        state="staging_in",
    )
    assert made is store.job("7")
    assert made == Store(tmp_path / "state.db").job("7")


def test_an_attempt_is_recorded_running_then_its_progress_then_its_end(tmp_path: Path) -> None:
    store = store_with_jobs(tmp_path)  # job 104 has directives 0..3
    store.add_attempt("104", 2, "104:2.abc/0", 0, 2)
    store.add_attempt("104", 2, "104:2.abc/1", 1, 2)
    [first, second] = store.attempts("104")
    assert (first.id, first.idx, first.shard, first.shards) == ("104:2.abc/0", 2, 0, 2)
    assert (first.state, first.node, first.bytes, first.ended) == ("running", "", 0, None)
    store.attempt_progress([("104:2.abc/0", "dtn1", 300, 3), ("104:2.abc/1", "dtn2", 10, 1)])
    store.end_attempt("104:2.abc/0", "done", "dtn1", 400, 4)
    store.end_attempt("104:2.abc/1", "failed", "dtn2", 10, 1, "permission denied")
    ended = [(a.node, a.state, a.bytes, a.files, a.error) for a in store.attempts("104")]
    assert ended == [("dtn1", "done", 400, 4, ""), ("dtn2", "failed", 10, 1, "permission denied")]
    assert all(a.ended is not None for a in store.attempts("104"))
    assert store.nodes() == {"104": ["dtn1", "dtn2"]}


def test_progress_saved_after_an_attempt_ended_leaves_its_end_alone(tmp_path: Path) -> None:
    """The progress loop may hold an update older than the end it writes after."""
    store = store_with_jobs(tmp_path)
    store.add_attempt("104", 0, "104:0.abc", 0, 1)
    store.end_attempt("104:0.abc", "done", "dtn1", 400, 4)
    store.attempt_progress([("104:0.abc", "dtn1", 300, 3)])
    [attempt] = store.attempts("104")
    assert (attempt.state, attempt.bytes, attempt.files) == ("done", 400, 4)


def test_attempts_left_running_are_lost_and_go_with_their_job(tmp_path: Path) -> None:
    store = store_with_jobs(tmp_path)
    store.add_attempt("104", 0, "104:0.a", 0, 1)
    store.add_attempt("104", 1, "104:1.b", 0, 1)
    store.end_attempt("104:1.b", "done", "dtn1", 1, 1)
    store.add_attempt("103", 0, "103:0.c", 0, 1)
    assert len(Store(tmp_path / "state.db").lose_attempts()) == 2
    assert [a.state for a in store.attempts("104")] == ["lost", "done"]
    store.delete_job("104")  # purged
    store.create_job("103", uid=1, gid=1, pool=None, size=0, scratch=None,
                     directives=[directive(0)])  # fmt: skip  # the id reused
    assert store.attempts("104") == [] and store.attempts("103") == []
    assert store.nodes() == {}


def test_memory_follows_the_jobs_in_flight_not_the_jobs_seen(tmp_path: Path) -> None:
    """A daemon that has finished thousands of jobs holds no more than one that has finished
    a few hundred: a finished job's copy leaves memory (reading it again reads the database)."""
    import gc
    import tracemalloc

    store = Store(tmp_path / "state.db")

    def run_jobs(first: int, count: int) -> None:
        for n in range(first, first + count):
            job_id = str(n)
            rows = [directive(0), directive(1)]
            store.create_job(job_id, uid=1000, gid=1000, pool="scratch", size=0,
                             scratch=f"/scratch/{n}", directives=rows)  # fmt: skip
            store.set_job(job_id, state="staging_in")
            store.set_directive(job_id, 0, state="running")
            store.set_directive(job_id, 0, state="done")
            store.set_job(job_id, state="done")
            assert store.job(job_id).state == "done"  # type: ignore[union-attr]

    run_jobs(0, 200)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run_jobs(200, 2000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 200_000, f"{grown} bytes more after 2,000 more finished jobs"
    assert store.job("5").state == "done"  # type: ignore[union-attr]
