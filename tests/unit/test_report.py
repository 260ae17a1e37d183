"""What `bbstage status` and `bbstage jobs` show: which transfer nodes moved what (Dask), and
the local engine's output as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from bbstage.cli import render
from bbstage.daemon import report
from bbstage.daemon.state import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "state.db")
    directives = [
        {
            "index": i,
            "line": 2 + i,
            "verb": "stage_in",
            "source": f"/s{i}/",
            "destination": f"/d{i}/",
        }  # fmt: skip
        for i in range(2)
    ]
    store.create_job("42", uid=1000, gid=1000, pool=None, size=0, scratch=None,
                     directives=directives, state="staging_in")  # fmt: skip
    return store


def with_attempts(store: Store) -> None:
    """Directive 1 split in two shards on dtn1 and dtn2; dtn1's first attempt failed."""
    store.add_attempt("42", 1, "42:1.a/0", 0, 2)
    store.end_attempt("42:1.a/0", "failed", "dtn1", 1 << 20, 2, "Dask task lost")
    store.add_attempt("42", 1, "42:1.b/0", 0, 2)
    store.add_attempt("42", 1, "42:1.b/1", 1, 2)
    store.attempt_progress([("42:1.b/0", "dtn1", 3 << 20, 10), ("42:1.b/1", "dtn2", 5 << 20, 7)])
    store.end_attempt("42:1.b/1", "done", "dtn2", 6 << 20, 8)


def test_status_tells_what_each_node_moved_and_every_attempt(store: Store) -> None:
    with_attempts(store)
    job = store.job("42")
    assert job is not None
    status = report.job_status(job, store.attempts("42"))
    local, remote = status["directives"]
    assert local["nodes"] == [] and local["attempts"] == []
    assert remote["nodes"] == [
        {"node": "dtn1", "bytes": 4 << 20, "files": 12, "running": True},
        {"node": "dtn2", "bytes": 6 << 20, "files": 8, "running": False},
    ]
    assert [(a["id"], a["node"], a["state"]) for a in remote["attempts"]] == [
        ("42:1.a/0", "dtn1", "failed"),
        ("42:1.b/0", "dtn1", "running"),
        ("42:1.b/1", "dtn2", "done"),
    ]
    assert remote["attempts"][0]["error"] == "Dask task lost"


def test_the_text_shows_the_nodes_of_a_directive_moved_on_transfer_nodes(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    job = store.job("42")
    assert job is not None
    render.status(report.job_status(job, store.attempts("42")))
    local = capsys.readouterr().out
    assert "nodes:" not in local  # the local engine's output as before
    with_attempts(store)
    render.status(report.job_status(job, store.attempts("42")))
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == local.splitlines()[:3]
    assert lines[3] == "      nodes: dtn1 12 files 4.0 MiB, dtn2 8 files 6.0 MiB"


def test_jobs_shows_a_nodes_column_only_when_a_job_ran_on_transfer_nodes(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    job = store.job("42")
    assert job is not None
    render.jobs(report.jobs_summary([job], store.nodes()))
    assert "NODES" not in capsys.readouterr().out
    with_attempts(store)
    [row] = report.jobs_summary([job], store.nodes())
    assert row["nodes"] == ["dtn1", "dtn2"]
    render.jobs([row])
    header, line = capsys.readouterr().out.splitlines()
    assert header.endswith("  NODES") and line.endswith("  dtn1,dtn2")


def test_status_and_jobs_say_why_a_transfer_waits_for_a_slot(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A queued transfer shows its reason (the executor's ``why``) under its line in
    `bbstage status`, and at the end of its job's row in `bbstage jobs`."""
    reason = "queued: 3 of your transfers ahead, 2 running; 4 users share 8 slots"
    store.set_directive("42", 0, state="running")
    store.set_directive("42", 1, state="running")
    job = store.job("42")
    assert job is not None

    def why(key: str) -> str | None:
        return reason if key == "42:1" else None

    render.status(report.job_status(job, why=why))
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"      {reason}" and lines[-2].startswith("  #1 in  running")
    assert reason not in "\n".join(lines[:-1])
    render.jobs(report.jobs_summary([job], why=why))
    assert capsys.readouterr().out.splitlines()[1].endswith(f"  ({reason})")
