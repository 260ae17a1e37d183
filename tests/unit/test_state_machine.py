"""The state machine: every pair of states of each kind is either a legal move (``MOVES``)
or refused by ``transition``; the store refuses an illegal write and changes nothing; the
states are the strings of every earlier version, so a database written before them loads."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest

from bbstage.daemon.state import (
    MOVES,
    AttemptState,
    DirectiveState,
    IllegalTransition,
    JobState,
    Store,
    transition,
)

KINDS = (JobState, DirectiveState, AttemptState)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_the_whole_table_every_legal_move_taken_every_other_pair_refused(
    kind: type[JobState | DirectiveState | AttemptState],
) -> None:
    assert set(MOVES[kind]) == set(kind), "every state has its row of moves"
    legal = 0
    for current, new in itertools.product(kind, kind):
        if new in MOVES[kind][current]:
            moved = transition(current, new)
            assert moved is new and type(moved) is kind
            assert transition(current, new.value) is new  # a value read from the database
            legal += 1
        else:
            with pytest.raises(IllegalTransition, match=f"{current} -> {new}"):
                transition(current, new)
    assert legal == sum(len(to) for to in MOVES[kind].values())
    with pytest.raises(IllegalTransition):  # not a state of this kind at all
        transition(next(iter(kind)), "no-such-state")


def test_a_finished_job_never_moves_again_but_a_cancelled_one_may_fail() -> None:
    """The table's one exit from a finished state: reconcile fails a job cancelled here that
    Slurm stranded (bbstage.daemon.reconcile)."""
    for done in (JobState.DONE, JobState.FAILED):
        assert MOVES[JobState][done] == frozenset()
    assert MOVES[JobState][JobState.CANCELLED] == {JobState.FAILED}


def test_the_values_are_the_strings_of_the_schema() -> None:
    assert [s.value for s in JobState] == [
        "setup", "staging_in", "staged_in", "running", "staging_out", "staged_out",
        "done", "failed", "cancelled",
    ]  # fmt: skip
    assert [s.value for s in DirectiveState] == [
        "pending", "running", "done", "failed", "cancelled"
    ]  # fmt: skip
    assert [s.value for s in AttemptState] == ["running", "done", "failed", "cancelled", "lost"]


def test_the_store_refuses_an_illegal_write_and_changes_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    d = {"index": 0, "line": 2, "verb": "stage_in", "source": "/a", "destination": "/b"}
    store.create_job("1", uid=1000, gid=1000, pool=None, size=0, scratch=None, directives=[d])
    with pytest.raises(IllegalTransition, match="job 1"):
        store.set_job("1", state=JobState.RUNNING, error="x")  # setup -> running: no
    with pytest.raises(IllegalTransition, match="job 1 directive 0"):
        store.set_directive("1", 0, state=DirectiveState.DONE)  # pending -> done: no
    with pytest.raises(IllegalTransition):
        store.create_job("2", uid=1, gid=1, pool=None, size=0, scratch=None, directives=[],
                         state=JobState.DONE)  # fmt: skip
    store.add_attempt("1", 0, "1:0.a", 0, 1)
    store.end_attempt("1:0.a", AttemptState.DONE, "dtn1", 5, 1)
    with pytest.raises(IllegalTransition, match="attempt 1:0.a"):
        store.end_attempt("1:0.a", AttemptState.FAILED, "dtn1", 5, 1, "late")
    for reader in (store, Store(tmp_path / "state.db")):  # memory, and the database
        job = reader.job("1")
        assert job is not None and (job.state, job.error) == (JobState.SETUP, "")
        assert job.directives[0].state is DirectiveState.PENDING
        assert [(a.state, a.error) for a in reader.attempts("1")] == [(AttemptState.DONE, "")]
    assert store.job("2") is None
    store.close()


# The schema of the first release: no jobs.origin, no directives.files_skipped.
FIRST_SCHEMA = """
CREATE TABLE jobs (job_id TEXT PRIMARY KEY, uid INTEGER, gid INTEGER, pool TEXT, size INTEGER,
    scratch TEXT, state TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', created REAL NOT NULL,
    updated REAL NOT NULL);
CREATE TABLE directives (job_id TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
    idx INTEGER NOT NULL, line INTEGER NOT NULL, verb TEXT NOT NULL, source TEXT NOT NULL,
    destination TEXT NOT NULL, spec TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'pending',
    bytes_done INTEGER NOT NULL DEFAULT 0, bytes_total INTEGER NOT NULL DEFAULT 0,
    files_done INTEGER NOT NULL DEFAULT 0, files_total INTEGER NOT NULL DEFAULT 0,
    error TEXT NOT NULL DEFAULT '', started REAL, finished REAL, PRIMARY KEY (job_id, idx));
CREATE TABLE attempts (id TEXT PRIMARY KEY, job_id TEXT NOT NULL, idx INTEGER NOT NULL,
    shard INTEGER NOT NULL, shards INTEGER NOT NULL, node TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL DEFAULT 'running', bytes INTEGER NOT NULL DEFAULT 0,
    files INTEGER NOT NULL DEFAULT 0, error TEXT NOT NULL DEFAULT '', started REAL NOT NULL,
    ended REAL, FOREIGN KEY (job_id, idx) REFERENCES directives (job_id, idx) ON DELETE CASCADE);
"""


def test_a_database_written_before_the_enums_loads_and_moves_on(tmp_path: Path) -> None:
    """The states as the old code wrote them (plain strings, the first schema): read back as
    the enums, counted and selected by state, and moved on from there by the table's rules."""
    path = tmp_path / "state.db"
    db = sqlite3.connect(path)
    db.executescript(FIRST_SCHEMA)
    spec = '{"index": 0, "line": 2, "verb": "stage_out", "source": "/s", "destination": "/d"}'
    for job_id, state, directive in (("1", "running", "running"), ("2", "failed", "failed"),
                                     ("3", "staging_in", "pending")):  # fmt: skip
        db.execute("INSERT INTO jobs VALUES (?, 1000, 1000, NULL, 0, NULL, ?, '', 1.0, 1.0)",
                   (job_id, state))  # fmt: skip
        db.execute("INSERT INTO directives (job_id, idx, line, verb, source, destination, spec,"
                   " state) VALUES (?, 0, 2, 'stage_out', '/s', '/d', ?, ?)",
                   (job_id, spec, directive))  # fmt: skip
    db.execute("INSERT INTO attempts (id, job_id, idx, shard, shards, started)"
               " VALUES ('1:0.a', '1', 0, 0, 1, 1.0)")  # fmt: skip
    db.commit()
    db.close()

    store = Store(path)
    running = store.job("1")
    assert running is not None and running.state is JobState.RUNNING
    assert running.directives[0].state is DirectiveState.RUNNING
    assert running.origin == "setup" and running.directives[0].files_skipped == 0
    assert [j.job_id for j in store.jobs((JobState.STAGING_IN,))] == ["3"]
    assert store.counts() == {"running": 1, "failed": 1, "staging_in": 1}
    assert store.lose_attempts() == ["1:0.a"]
    assert [a.state for a in store.attempts("1")] == [AttemptState.LOST]
    store.set_job("1", state=JobState.STAGING_OUT)
    store.set_directive("1", 0, state=DirectiveState.DONE)
    with pytest.raises(IllegalTransition):
        store.set_job("2", state=JobState.DONE)  # failed is final
    store.close()
    again = Store(path).job("1")
    assert again is not None and again.state is JobState.STAGING_OUT
    assert again.directives[0].state is DirectiveState.DONE
