"""The engine's verdicts (I1, I4): done only from a manifest that covers the plan; a stopped or
cancelled transfer is never done; a blocking data_in never answers busy; a reused job id and
a lost state never cost a job its results."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from bbstage import directives, movers
from bbstage.config import Config, Pool
from bbstage.daemon.contracts import Executor, Sink
from bbstage.daemon.engine import Engine
from bbstage.daemon.events import EngineEvent, HookAnswered, TransferEnded
from bbstage.daemon.server import Server
from bbstage.daemon.state import Store
from bbstage.movers import Cancelled, TransferError
from bbstage.protocol import Request, encode_request
from bbstage.transfer import AttemptUpdate, Done, Planned, TransferSpec
from tests.helpers import wait_until_async

UID, GID = 65534, 65534  # nobody: Identity.of accepts any known non-root user


class FakeExecutor:
    """Answers each submit with the next scripted outcome: (plan, Done or an exception). An
    ``Executor`` (bbstage/daemon/contracts.py), as the engine needs."""

    running = queued = 0

    def why(self, key: str) -> str | None:
        return None

    def users(self) -> dict[int, tuple[int, int]]:
        return {}

    def __init__(self) -> None:
        self.outcomes: list[tuple[Planned, Done | BaseException | None]] = []
        self.pending: list[Future[Done]] = []
        self.specs: list[TransferSpec] = []
        self.submitted: dict[str, Future[Done]] = {}  # the latest attempt, by "job:directive"
        self.abandoned: list[str] = []  # attempts a restart handed over as lost
        self.orders: list[tuple[Any, ...]] = []  # each submit's place in its user's queue

    def submit(
        self,
        key: str,
        spec: TransferSpec,
        identity: Any,
        on_event: Sink,
        order: tuple[Any, ...] = (),
    ) -> Future[Done]:
        self.specs.append(spec)
        self.orders.append(order)
        plan, outcome = self.outcomes.pop(0)
        on_event(plan)
        future: Future[Done] = Future()
        self.submitted[key] = future
        if isinstance(outcome, Done):
            future.set_result(outcome)
        elif isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            self.pending.append(future)  # never finishes by itself
        return future

    def abandon(self, attempts: list[str]) -> None:
        self.abandoned += attempts

    def cancel(self, key: str) -> None:
        for future in self.pending:
            if not future.done():
                future.set_exception(Cancelled())

    def hold(self) -> None:
        pass

    def shutdown(self) -> None:
        self.cancel("")


class NodesExecutor(FakeExecutor):
    """A FakeExecutor with one attempt per transfer on transfer node dtn1, told as the Dask
    executor tells them: running first (noting what the state holds then, as it would submit
    it), then its progress, then its end (before the transfer's future resolves)."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.at_submit: list[list[tuple[str, str]]] = []  # the job's attempts then
        self.tell: dict[str, Callable[[AttemptUpdate], None]] = {}  # by attempt id

    def submit(
        self,
        key: str,
        spec: TransferSpec,
        identity: Any,
        on_event: Sink,
        order: tuple[Any, ...] = (),
    ) -> Future[Done]:
        attempt = f"{key}.{uuid.uuid4().hex[:12]}"
        self.tell[attempt] = on_event
        on_event(AttemptUpdate(attempt, 0, 1))
        self.at_submit.append([(a.id, a.state) for a in self.store.attempts(spec.job_id)])
        on_event(AttemptUpdate(attempt, 0, 1, node="dtn1", bytes=5, files=1))
        outcome = self.outcomes[0][1]
        if outcome is not None:
            state = {Done: "done", Cancelled: "cancelled"}.get(type(outcome), "failed")
            error = str(outcome) if state == "failed" else ""
            on_event(AttemptUpdate(attempt, 0, 1, state, "dtn1", 10, 1, error))
        return super().submit(key, spec, identity, on_event, order)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    pool = Pool("scratch", tmp_path / "scratch", 1 << 30)
    config = Config(socket=tmp_path / "run" / "control.sock", pools=(pool,))
    store = Store(tmp_path / "state.db")
    executor = FakeExecutor()
    assert isinstance(executor, Executor)
    yield Engine(config, store, executor)
    store.close()


def script(*lines: str) -> str:
    return "#!/bin/bash\n" + "".join(f"#BB_LUA {line}\n" for line in lines)


def recorded(engine: Engine) -> bool:
    """Whether the engine has recorded every transfer that has finished: its done callbacks
    run on later turns of the event loop than the one the executor's future ends in."""
    executor: FakeExecutor = engine.executor  # type: ignore[assignment]
    for key, future in executor.submitted.items():
        job_id, idx = key.split(":")
        if future.done() and (job_id, int(idx)) in engine._running:
            return False
    return True


def ask(engine: Engine, op: str, **fields: Any) -> tuple[str, str]:
    async def call() -> tuple[str, str]:
        reply = await engine.handle(Request(op, fields))
        await wait_until_async(lambda: recorded(engine), 5, "the engine to record the outcomes")
        return reply.status, reply.message

    return asyncio.run(call())


def setup(engine: Engine, job_id: str, *lines: str, uid: int = UID) -> None:
    fields = {"job_id": job_id, "uid": uid, "gid": GID, "script": script(*lines)}
    assert ask(engine, "setup", **fields) == ("ok", "")


def outcomes(engine: Engine) -> list[tuple[Planned, Done | BaseException | None]]:
    return engine.executor.outcomes  # type: ignore[attr-defined,no-any-return]


def states(engine: Engine, job_id: str) -> list[str]:
    job = engine.store.job(job_id)
    assert job is not None
    return [d.state for d in job.directives]


def test_done_needs_a_manifest_that_covers_the_plan(engine: Engine) -> None:
    setup(engine, "1", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(300, 3), Done(200, 2)))  # a file short
    status, message = ask(engine, "data_in", job_id="1")
    assert status == "error" and "committed 2 files (200 bytes) of the 3 files" in message
    assert states(engine, "1") == ["failed"]


def test_a_covering_manifest_is_done(engine: Engine) -> None:
    setup(engine, "2", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(300, 3), Done(300, 3)))
    assert ask(engine, "data_in", job_id="2") == ("ok", "")
    assert states(engine, "2") == ["done"]


def test_a_transient_failure_runs_again_and_blocking_data_in_never_says_busy(
    engine: Engine,
) -> None:
    """Before 24.05 any success starts the job: data_in must wait for the second attempt."""
    setup(engine, "3", "stage_in source=/a/ destination=/b/")
    outcomes(engine).extend(
        [
            (Planned(10, 1), TransferError("worker exited with code -9", permanent=False)),
            (Planned(10, 1), Done(10, 1)),
        ]
    )
    assert ask(engine, "data_in", job_id="3") == ("ok", "")
    specs = engine.executor.specs  # type: ignore[attr-defined]
    assert [s.resumed for s in specs] == [False, True]  # the second sweeps stale temp files


def test_a_transfer_stopped_by_shutdown_is_not_recorded_and_resumes(engine: Engine) -> None:
    setup(engine, "4", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(10, 1), None))

    async def scenario() -> tuple[str, str]:
        fake: FakeExecutor = engine.executor  # type: ignore[assignment]
        hook = asyncio.create_task(engine.handle(Request("data_in", {"job_id": "4"})))
        await wait_until_async(lambda: fake.pending, 5, "the transfer to start")
        hook.cancel()  # the server closes: the waiting hook goes away first
        await wait_until_async(hook.done, 5, "the hook's task to end")
        assert not engine.executor.pending[0].done()  # type: ignore[attr-defined] # still runs
        await engine.stop()  # then the executor stops the transfer
        await wait_until_async(lambda: recorded(engine), 5, "the engine to see the transfer end")
        reply = await engine.handle(Request("test_data_in", {"job_id": "4"}))
        return reply.status, reply.message

    assert asyncio.run(scenario()) == ("busy", "")
    assert states(engine, "4") == ["running"]
    job = engine.store.job("4")
    assert job is not None and job.state == "staging_in"


def test_cancel_is_told_by_type_not_by_text(engine: Engine) -> None:
    setup(engine, "5", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(10, 1), TransferError("cancelled")))  # a message, no more
    ask(engine, "data_in", job_id="5")
    assert states(engine, "5") == ["failed"]
    setup(engine, "6", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(10, 1), Cancelled()))
    ask(engine, "data_in", job_id="6")
    assert states(engine, "6") == ["cancelled"]


def test_pre_run_of_a_job_the_daemon_does_not_know_refuses(engine: Engine) -> None:
    """24.05+ hooks carry the owner: a lost state must not become an empty job that runs."""
    status, message = ask(engine, "pre_run", job_id="7", uid=UID, gid=GID, script=script())
    assert status == "error" and "unknown to the staging daemon" in message
    assert engine.store.job("7") is None


def test_pre_run_before_the_stage_in_finished_refuses(engine: Engine) -> None:
    setup(engine, "8", "stage_in source=/a/ destination=/b/")
    status, message = ask(engine, "pre_run", job_id="8")
    assert status == "error" and "stage-in has not finished" in message


def test_pre_run_of_a_job_torn_down_before_it_ran_refuses(engine: Engine) -> None:
    """Slurm lost track (a slurmctld restart mid stage-in): the inputs in scratch are gone."""
    setup(engine, "12", "stage_in source=/a/ destination=$BB_SCRATCH/a/")
    outcomes(engine).append((Planned(5, 1), Done(5, 1)))
    assert ask(engine, "data_in", job_id="12") == ("ok", "")
    assert ask(engine, "teardown", job_id="12", hurry=True)[0] == "ok"
    status, message = ask(engine, "pre_run", job_id="12")
    assert status == "error" and "torn down before it started" in message


def test_a_job_recreated_after_a_lost_state_never_deletes_scratch(engine: Engine) -> None:
    lines = ("stage_out source=$BB_SCRATCH/out.dat destination=/results/out.dat",)
    outcomes(engine).append((Planned(5, 1), Done(5, 1)))
    fields = {"job_id": "9", "uid": UID, "gid": GID, "script": script(*lines)}
    assert ask(engine, "data_out", **fields, wait=True) == ("ok", "")  # recreated: stages out
    job = engine.store.job("9")
    assert job is not None and job.origin == "recovered" and job.scratch
    (Path(job.scratch) / "other-results").write_text("kept")
    assert ask(engine, "teardown", job_id="9", hurry=False)[0] == "ok"
    assert (Path(job.scratch) / "other-results").read_text() == "kept"


def test_teardown_of_a_job_that_ran_keeps_scratch_with_a_stage_out_never_started(
    engine: Engine,
) -> None:
    setup(engine, "10", "stage_out source=$BB_SCRATCH/out.dat destination=/results/out.dat")
    assert ask(engine, "data_in", job_id="10") == ("ok", "")
    assert ask(engine, "pre_run", job_id="10") == ("ok", "")
    job = engine.store.job("10")
    assert job is not None and job.scratch
    (Path(job.scratch) / "out.dat").write_text("results")
    assert ask(engine, "teardown", job_id="10", hurry=True)[0] == "ok"  # e.g. scancel
    assert (Path(job.scratch) / "out.dat").read_text() == "results"


def test_a_reused_job_id_gets_a_fresh_record_and_the_old_results_are_set_aside(
    engine: Engine,
) -> None:
    setup(engine, "11", "stage_out source=$BB_SCRATCH/out.dat destination=/results/out.dat")
    assert ask(engine, "data_in", job_id="11") == ("ok", "")
    assert ask(engine, "pre_run", job_id="11") == ("ok", "")
    old = engine.store.job("11")
    assert old is not None and old.scratch
    (Path(old.scratch) / "out.dat").write_text("old results")
    other = os.getuid() if os.getuid() != 0 else 1  # daemon: another known non-root user
    setup(engine, "11", "stage_in source=/x destination=/y", uid=other)
    new = engine.store.job("11")
    assert new is not None and new.uid == other and new.directives[0].verb == "stage_in"
    kept = [p for p in Path(old.scratch).parent.iterdir() if p.name.startswith("11.kept-")]
    assert len(kept) == 1 and (kept[0] / "out.dat").read_text() == "old results"
    assert not (Path(old.scratch) / "out.dat").exists()


def test_a_setup_re_run_keeps_the_record(engine: Engine) -> None:
    setup(engine, "12", "stage_in source=/a/ destination=/b/")
    first = engine.store.job("12")
    setup(engine, "12", "stage_in source=/a/ destination=/b/")
    assert engine.store.job("12") is first


def test_purge_never_removes_the_scratch_of_a_recovered_job(engine: Engine) -> None:
    lines = ("stage_out source=$BB_SCRATCH/out.dat destination=/results/out.dat",)
    outcomes(engine).append((Planned(5, 1), Done(5, 1)))
    fields = {"job_id": "13", "uid": UID, "gid": GID, "script": script(*lines)}
    assert ask(engine, "data_out", **fields) == ("ok", "")
    job = engine.store.job("13")
    assert job is not None and job.scratch
    (Path(job.scratch) / "out.dat").write_text("kept")
    ask(engine, "teardown", job_id="13", hurry=False)
    engine.config = replace(engine.config, retention_days=-1)  # finished "long ago"

    asyncio.run(engine.purge_expired())
    assert engine.store.job("13") is None
    assert (Path(job.scratch) / "out.dat").read_text() == "kept"


def test_subscribers_hear_hooks_and_ended_transfers_and_a_broken_one_changes_nothing(
    engine: Engine,
) -> None:
    heard: list[EngineEvent] = []

    def broken(event: EngineEvent) -> None:
        raise RuntimeError("a subscriber's bug")

    engine.subscribe(broken)
    engine.subscribe(heard.append)
    setup(engine, "9", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(300, 3), Done(300, 3)))
    assert ask(engine, "data_in", job_id="9") == ("ok", "")
    assert states(engine, "9") == ["done"]
    assert [(e.op, e.status) for e in heard if isinstance(e, HookAnswered)] == [
        ("setup", "ok"),
        ("data_in", "ok"),
    ]
    ended = [e for e in heard if isinstance(e, TransferEnded)]
    assert [(e.direction, e.outcome, e.bytes, e.files) for e in ended] == [("in", "done", 300, 3)]


def test_an_attempt_is_recorded_before_it_is_submitted_and_its_end_after(
    engine: Engine,
) -> None:
    nodes = engine.executor = NodesExecutor(engine.store)
    setup(engine, "14", "stage_in source=/a/ destination=/b/")
    outcomes(engine).extend(
        [
            (Planned(10, 1), TransferError("Dask task lost", permanent=False)),
            (Planned(10, 1), Done(10, 1)),
        ]
    )
    assert ask(engine, "data_in", job_id="14") == ("ok", "")
    first, second = nodes.tell
    assert nodes.at_submit == [[(first, "running")], [(first, "failed"), (second, "running")]]
    rows = [(a.id, a.node, a.state, a.bytes, a.error) for a in engine.store.attempts("14")]
    assert rows == [
        (first, "dtn1", "failed", 10, "Dask task lost"),
        (second, "dtn1", "done", 10, ""),
    ]


def test_an_attempts_node_and_progress_are_saved_within_a_second(engine: Engine) -> None:
    nodes = engine.executor = NodesExecutor(engine.store)
    setup(engine, "15", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(10, 1), None))  # runs until cancelled

    async def scenario() -> None:
        recording = asyncio.create_task(engine.record_progress())
        await engine.handle(Request("data_in", {"job_id": "15", "wait": False}))
        [attempt] = nodes.tell
        for moved in (6, 7):
            nodes.tell[attempt](AttemptUpdate(attempt, 0, 1, node="dtn2", bytes=moved, files=1))

            def saved(n: int = moved) -> bool:
                return [(a.node, a.bytes) for a in engine.store.attempts("15")] == [("dtn2", n)]

            await wait_until_async(saved, 1.5, "the attempt's progress in the state")
        recording.cancel()

    asyncio.run(scenario())


def test_a_restart_marks_the_attempts_it_stopped_lost_and_resumes_with_a_new_one(
    engine: Engine,
) -> None:
    nodes = engine.executor = NodesExecutor(engine.store)
    setup(engine, "16", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(10, 1), None))
    assert ask(engine, "data_in", job_id="16", wait=False) == ("ok", "")
    restarted_nodes = NodesExecutor(engine.store)
    restarted = Engine(engine.config, engine.store, restarted_nodes)
    outcomes(restarted).append((Planned(10, 1), Done(10, 1)))

    async def resume() -> None:
        restarted.resume()
        await wait_until_async(lambda: recorded(restarted), 5, "the resumed transfer to end")

    asyncio.run(resume())
    assert [a.state for a in engine.store.attempts("16")] == ["lost", "done"]
    # the executor is told which, to stop them and delete what they left on the scheduler
    assert restarted_nodes.abandoned == [engine.store.attempts("16")[0].id]
    assert nodes.at_submit == [[(next(iter(nodes.tell)), "running")]]


def lost_part(area: Path, job_id: str) -> tuple[Path, Path]:
    """A destination directory of the user's, and a killed worker's temporary file of job
    ``job_id`` in it: (directory, file)."""
    dest = area / "in"
    dest.mkdir()
    os.chown(dest, UID, GID)
    part = dest / f".big.bin.bbstage-{job_id}-0123abcd.part"
    part.write_bytes(b"partial")
    os.chown(part, UID, GID)
    return dest, part


@pytest.mark.parametrize("op", ["teardown", "test_data_in"])
def test_a_hook_for_a_job_the_daemon_lost_removes_its_temporary_files(
    engine: Engine, area: Path, op: str
) -> None:
    """Its worker was killed, then the daemon and its state before the worker's temporary
    file was removed: the script Slurm kept says where to look. (24.11 holds such a job at
    test_data_in, and may remove the script of a held job cancelled before teardown.)"""
    dest, part = lost_part(area, "14")
    job = area / "script"
    job.write_text(script(f"stage_in source=/data/big.bin destination={dest}/big.bin"))
    ask(engine, op, job_id="15", hurry=True, uid=UID, gid=GID, script_path=str(job))
    assert part.exists()  # another job's
    ask(engine, op, job_id="14", hurry=True, uid=UID, gid=GID)  # no path: nothing to go by
    assert part.exists()
    ask(engine, op, job_id="14", hurry=True, uid=UID, gid=GID, script_path=str(job))
    assert not part.exists() and engine.store.job("14") is None


def test_a_blocking_data_in_of_a_lost_job_removes_its_temporary_files(
    engine: Engine, area: Path
) -> None:
    """22.05's data_in carries the script but no uid: the job cannot be made again."""
    dest, part = lost_part(area, "16")
    lines = (f"stage_in source=/data/big.bin destination={dest}/big.bin",)
    status, message = ask(engine, "data_in", job_id="16", script=script(*lines), wait=True)
    assert status == "error" and "unknown to the staging daemon" in message
    assert not part.exists()


def test_a_jobs_expected_start_and_priority_place_it_in_its_users_queue(engine: Engine) -> None:
    """Where the hooks send Slurm's expected start time and priority, the executor gets
    them as the job's place in its user's queue; where not, every job is equal (arrival)."""
    setup(engine, "60", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(1, 1), Done(1, 1)))
    ask(engine, "data_in", job_id="60", start_time="1700000000", priority="500")
    setup(engine, "61", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(1, 1), Done(1, 1)))
    ask(engine, "data_in", job_id="61")
    orders = engine.executor.orders  # type: ignore[attr-defined]
    assert orders == [(1700000000.0, -500.0), (float("inf"), -0.0)]


def test_a_bug_in_a_hook_handler_is_answered_as_the_daemons_error_not_the_jobs(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception in a handler, a ValueError too (it used to pass for a
    refusal, its text shown to Slurm as if the script were wrong), is logged with its
    traceback and answered as a bug in the daemon that names its log; a refusal stays one."""

    def broken(text: str, registry: object) -> dict[str, Any]:
        raise ValueError("invalid literal for int() with base 10: 'x'")

    monkeypatch.setattr(directives, "parse", broken)
    with capture_logs() as logs:
        status, message = ask(engine, "setup", job_id="5", uid=UID, gid=GID, script=script())
    assert status == "error"
    assert message.startswith("staging daemon internal error (ValueError): a bug in bbstage")
    assert "daemon's log" in message and "setup, job 5" in message
    assert "invalid literal" not in message  # a bug's own text is for the log, not the job
    failed = [e for e in logs if e["event"] == "hook failed: internal error"]
    assert len(failed) == 1 and failed[0]["exc_info"] is True and failed[0]["hook"] == "setup"
    monkeypatch.undo()
    with capture_logs() as logs:
        status, message = ask(engine, "setup", job_id="6", uid=UID, gid=GID, script=script(
            "stage_in source=/a/ destination=/b/ nonsense=1"))  # fmt: skip
        assert status == "error" and "internal error" not in message
        status, message = ask(engine, "data_in", job_id="x1")  # a bad request: no bug either
        assert message == "bad request: data_in: job_id must be a number, got 'x1'"

        def no_backend(*args: Any) -> None:
            raise TransferError("the gs backend cannot load: install gcsfs")

        monkeypatch.setattr(movers, "options_for", no_backend)  # a site's setup, not a bug
        setup(engine, "7", "stage_in source=/a/ destination=/b/")
        assert ask(engine, "data_in", job_id="7") == (
            "error", "the gs backend cannot load: install gcsfs"
        )  # fmt: skip
    assert not [e for e in logs if e.get("exc_info")]


def test_a_bug_answering_a_user_is_the_daemons_error_and_a_refused_copy_a_refusal(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The users' socket too: a refusal (``bbstage copy`` into a job that is not running)
    is answered with its reason, a bug as the daemon's, logged with its traceback."""
    engine.config = replace(engine.config, job_check="state")  # no squeue here
    server = Server(engine)
    setup(engine, "7", "stage_in source=/a/ destination=/b/")
    copy = encode_request("copy", job_id="7", source="/a", destination="/b") + b"\n"
    refused = json.loads(asyncio.run(server.respond(copy, UID)))
    assert refused == {"status": "error", "message": "copy: job 7 is not running (setup):"
                       " copies are added from inside the running job"}  # fmt: skip

    def broken(job_id: str) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(engine.store, "job", broken)
    status = encode_request("status", job_id="7") + b"\n"
    with capture_logs() as logs:
        reply = json.loads(asyncio.run(server.respond(status, UID)))
    assert reply["status"] == "error"
    assert reply["message"].startswith("staging daemon internal error (OperationalError)")
    assert [e["op"] for e in logs if e.get("exc_info")] == ["status"]
    asyncio.run(server.close())


def test_a_job_only_moves_forward_and_a_hurried_teardown_ends_it_cancelled(
    engine: Engine,
) -> None:
    """A data_in or pre_run Slurm sends again late answers from the record and leaves the job
    where it is (it used to send a running job back to staging_in); a teardown in a hurry
    during stage-in cancels the copy and ends the job cancelled, not failed by the copy it
    cancelled."""
    setup(engine, "20", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(5, 1), Done(5, 1)))
    assert ask(engine, "data_in", job_id="20") == ("ok", "")
    assert ask(engine, "pre_run", job_id="20") == ("ok", "")
    for hook in ("data_in", "pre_run", "test_data_in"):
        assert ask(engine, hook, job_id="20") == ("ok", "")
        job = engine.store.job("20")
        assert job is not None and job.state == "running", hook

    setup(engine, "21", "stage_in source=/a/ destination=/b/")
    outcomes(engine).append((Planned(5, 1), None))  # runs until cancelled

    async def scenario() -> None:  # one event loop, as in the daemon
        reply = await engine.handle(Request("data_in", {"job_id": "21", "wait": False}))
        assert reply.status == "ok"
        reply = await engine.handle(Request("teardown", {"job_id": "21", "hurry": True}))
        assert reply.status == "ok"
        await wait_until_async(lambda: recorded(engine), 5, "the cancelled copy's end")

    asyncio.run(scenario())
    job = engine.store.job("21")
    assert job is not None and (job.state, job.error) == ("cancelled", "")
    assert states(engine, "21") == ["cancelled"]


def test_two_teardowns_at_once_end_the_job_once(engine: Engine) -> None:
    """Slurm's teardown hook and the reconciler's (a job Slurm no longer runs) may tear the
    same job down at once: each awaits scratch's removal, then the job ends once, cancelled,
    without an illegal move (seen on the real cluster: cancelled -> cancelled raised in the
    reconciler)."""
    setup(engine, "22", "stage_in source=/a/ destination=$BB_SCRATCH/a/")

    async def scenario() -> None:  # one event loop, as in the daemon
        await asyncio.gather(engine.end_job("22", hurry=True), engine.end_job("22", hurry=True))

    asyncio.run(scenario())
    job = engine.store.job("22")
    assert job is not None and (job.state, job.error) == ("cancelled", "")
