"""The lifecycle's decisions, called directly: a job's rows and an event in, the job as the
actions leave it and the actions out; no store, no executor, no event loop."""

from __future__ import annotations

from typing import Any

import pytest

from bbstage.daemon import lifecycle
from bbstage.daemon.events import TransferEnded
from bbstage.daemon.lifecycle import (
    ATTEMPTS,
    COPY,
    Decision,
    Emit,
    Ended,
    MarkStaged,
    Note,
    Refused,
    SetDirective,
    SetJob,
    Start,
)
from bbstage.daemon.state import (
    LIFECYCLE,
    MOVES,
    ORDER,
    DirectiveRow,
    DirectiveState,
    JobRow,
    JobState,
)
from bbstage.movers import Cancelled, TransferError
from bbstage.protocol import BUSY, ERROR, OK
from bbstage.transfer import Done, Planned

D, J = DirectiveState, JobState


def row(
    idx: int, verb: str = "stage_in", state: DirectiveState = D.PENDING, **spec: Any
) -> DirectiveRow:
    spec = {
        "index": idx,
        "line": idx + 2,
        "verb": verb,
        "source": "/a",
        "destination": "/b",
        **spec,
    }
    return DirectiveRow("7", idx, idx + 2, verb, "/a", "/b", spec, state)


def job(state: JobState, *rows: DirectiveRow, origin: str = "setup") -> JobRow:
    return JobRow("7", 1000, 1000, "p", 0, "/scratch/7", state, "", 0.0, 0.0, origin, list(rows))


def kinds(decision: Decision) -> list[type]:
    return [type(a) for a in decision.actions]


def writes(decision: Decision) -> list[dict[str, Any]]:
    return [a.values for a in decision.actions if isinstance(a, (SetJob, SetDirective))]


# -- the order, written once --------------------------------------------------------------


def test_the_job_moves_follow_the_lifecycle_order() -> None:
    assert [p.name for p in LIFECYCLE] == ["setup", "stage_in", "run", "stage_out"]
    assert ORDER == (J.SETUP, J.STAGING_IN, J.STAGED_IN, J.RUNNING, J.STAGING_OUT, J.STAGED_OUT)
    ends = {J.DONE, J.FAILED, J.CANCELLED}
    for i, state in enumerate(ORDER[:-1]):
        assert ORDER[i + 1] in MOVES[JobState][state]
        assert ends <= MOVES[JobState][state]
        if i < ORDER.index(J.STAGING_OUT):  # staging out from any earlier state
            assert J.STAGING_OUT in MOVES[JobState][state]
    assert MOVES[JobState][J.STAGED_OUT] == ends  # nothing after it but an end
    assert J.STAGED_IN not in MOVES[JobState][J.SETUP]  # no phase skipped
    assert J.STAGING_IN not in MOVES[JobState][J.RUNNING]  # none entered again


# -- begin, start, settle -----------------------------------------------------------------


def test_begin_enters_the_phase_and_starts_each_unfinished_directive() -> None:
    decision = lifecycle.begin(
        job(J.SETUP, row(0), row(1, state=D.DONE), row(2, "stage_out")), "stage_in", (), False
    )
    assert decision.actions == (SetJob("7", {"state": J.STAGING_IN, "error": ""}), Start("7", 0))
    assert decision.job is not None and decision.job.state == J.STAGING_IN


def test_begin_of_a_job_past_the_phase_decides_nothing() -> None:
    decision = lifecycle.begin(job(J.RUNNING, row(0)), "stage_in", (), False)
    assert decision.actions == ()
    assert lifecycle.begin(job(J.FAILED, row(0)), "stage_out", (), False).actions == ()


def test_a_recorded_failure_stands_but_a_running_one_is_joined() -> None:
    failed = job(J.STAGING_IN, row(0, state=D.FAILED), row(1, state=D.DONE))
    decision = lifecycle.begin(failed, "stage_in", (), False)
    assert decision.actions == (
        SetJob("7", {"state": J.FAILED, "error": "stage_in line 2: failed"}),
    )
    joined = lifecycle.begin(failed, "stage_in", (0,), False)
    assert joined.actions == (Start("7", 0),)


def test_a_finished_stage_in_is_marked_staged() -> None:
    decision = lifecycle.settle(job(J.STAGING_IN, row(0, state=D.DONE)), "stage_in", False)
    assert decision.actions == (SetJob("7", {"state": J.STAGED_IN}), MarkStaged("7"))
    assert decision.job is not None and decision.job.state == J.STAGED_IN


def test_settle_waits_for_every_directive_and_for_no_teardown() -> None:
    running = job(J.STAGING_OUT, row(0, "stage_out", D.DONE), row(1, COPY, D.RUNNING))
    assert lifecycle.settle(running, "stage_out", False).actions == ()  # the copy is an output
    done = job(J.STAGING_OUT, row(0, "stage_out", D.DONE), row(1, COPY, D.DONE))
    assert lifecycle.settle(done, COPY, True).actions == ()  # its teardown decides
    assert writes(lifecycle.settle(done, COPY, False)) == [{"state": J.STAGED_OUT}]


def test_a_cancelled_copy_fails_nothing_a_cancelled_line_does() -> None:
    copy = row(1, COPY, D.CANCELLED, origin=COPY)
    assert writes(lifecycle.settle(job(J.STAGING_OUT, copy), "stage_out", False)) == [
        {"state": J.STAGED_OUT}
    ]
    line = row(1, "stage_out", D.CANCELLED)
    assert writes(lifecycle.settle(job(J.STAGING_OUT, line), "stage_out", False)) == [
        {"state": J.FAILED, "error": "stage_out line 3: cancelled"}
    ]


def test_resume_restarts_a_phase_and_a_running_jobs_copies() -> None:
    staging = lifecycle.resume(job(J.STAGING_IN, row(0, state=D.RUNNING)), (), False)
    assert kinds(staging) == [Note, Start]
    running = job(J.RUNNING, row(0, state=D.DONE), row(1, COPY, D.RUNNING), row(2, COPY, D.DONE))
    assert [a for a in lifecycle.resume(running, (), False).actions if isinstance(a, Start)] == [
        Start("7", 1)
    ]
    assert lifecycle.resume(job(J.STAGED_IN, row(0, state=D.DONE)), (), False).actions == ()


# -- a transfer's end ---------------------------------------------------------------------


PLAN = Planned(10, 2)


def ended(outcome: Done | BaseException, plan: Planned | None = PLAN, tries: int = 1,
          verb: str = "stage_in") -> Ended:  # fmt: skip
    return Ended("7", 0, verb, outcome, plan, {"bytes_total": 10, "files_total": 2}, tries, 100.0)


def test_done_only_from_a_manifest_that_covers_the_plan() -> None:
    running = job(J.STAGING_IN, row(0, state=D.RUNNING))
    decision = lifecycle.transfer_ended(running, ended(Done(10, 2)), False)
    assert kinds(decision) == [SetDirective, Note, Emit, SetJob, MarkStaged]
    assert writes(decision)[0] == {"state": D.DONE, "finished": 100.0, "bytes_total": 10,
                                   "files_total": 2, "bytes_done": 10, "files_done": 2}  # fmt: skip
    short = lifecycle.transfer_ended(running, ended(Done(5, 1)), False)
    assert writes(short)[0]["state"] == D.FAILED and "incomplete" in writes(short)[0]["error"]
    assert writes(short)[1]["state"] == J.FAILED
    no_plan = lifecycle.transfer_ended(running, ended(Done(10, 2), plan=None), False)
    assert writes(no_plan)[0]["state"] == D.FAILED


def test_a_transient_failure_is_tried_again_up_to_attempts() -> None:
    running = job(J.STAGING_IN, row(0, state=D.RUNNING))
    reset = TransferError("reset", permanent=False)
    again = lifecycle.transfer_ended(running, ended(reset), False)
    assert kinds(again) == [Note, Start] and again.actions[1] == Start("7", 0, 2)
    last = lifecycle.transfer_ended(running, ended(reset, tries=ATTEMPTS), False)
    assert writes(last)[0]["state"] == D.FAILED
    permanent = TransferError("denied", permanent=True)
    assert (
        writes(lifecycle.transfer_ended(running, ended(permanent), False))[0]["state"] == D.FAILED
    )


def test_a_cancelled_transfer_is_recorded_cancelled_and_told() -> None:
    running = job(J.STAGING_OUT, row(0, "stage_out", D.RUNNING))
    decision = lifecycle.transfer_ended(running, ended(Cancelled(), verb="stage_out"), False)
    emitted = [a.event for a in decision.actions if isinstance(a, Emit)]
    assert writes(decision)[0]["state"] == D.CANCELLED
    assert emitted == [TransferEnded("out", D.CANCELLED, 0.0, 0, 0, 1000)]
    assert decision.job is not None and decision.job.state == J.FAILED


def test_the_end_of_a_transfer_whose_job_is_gone_is_written_and_nothing_else() -> None:
    decision = lifecycle.transfer_ended(None, ended(TransferError("x", permanent=False)), False)
    assert kinds(decision) == [SetDirective, Note] and decision.job is None


# -- verdicts -----------------------------------------------------------------------------


def test_the_first_failing_line_answers_once_the_lines_above_it_end() -> None:
    above = job(J.STAGING_IN, row(0, state=D.RUNNING), row(1, state=D.FAILED))
    assert lifecycle.verdict(above, "stage_in").status == BUSY
    ended_ = job(J.STAGING_IN, row(0, state=D.DONE), row(1, state=D.FAILED))
    assert lifecycle.verdict(ended_, "stage_in").status == ERROR
    assert lifecycle.verdict(job(J.STAGED_IN, row(0, state=D.DONE)), "stage_in").status == OK


def test_pre_run_starts_a_staged_job_once_and_refuses_one_torn_down() -> None:
    assert writes(lifecycle.start_run(job(J.STAGED_IN, row(0, state=D.DONE)))) == [
        {"state": J.RUNNING}
    ]
    assert lifecycle.start_run(job(J.RUNNING, row(0, state=D.DONE))).actions == ()
    with pytest.raises(Refused, match="torn down before it started"):
        lifecycle.start_run(job(J.DONE, row(0, state=D.DONE)))
    with pytest.raises(Refused, match="has not finished"):
        lifecycle.start_run(job(J.STAGING_IN, row(0, state=D.RUNNING)))


# -- the end ------------------------------------------------------------------------------


def test_a_teardown_keeps_scratch_that_holds_results_or_is_not_ours() -> None:
    out = row(0, "stage_out", D.FAILED, source_kind="scratch")
    at_risk = job(J.FAILED, out)
    kept = lifecycle.keep_scratch(at_risk, at_risk, 7)
    assert kept is not None and writes(kept) == [
        {"error": "stage-out incomplete: outputs kept in /scratch/7 for 7 days"}
    ]
    recovered = job(J.RUNNING, origin="recovered")
    kept = lifecycle.keep_scratch(recovered, recovered, 7)
    assert kept is not None and writes(kept)[0]["state"] == J.FAILED
    assert lifecycle.keep_scratch(job(J.STAGED_OUT), job(J.STAGED_OUT), 7) is None


def test_a_teardown_ends_a_job_once() -> None:
    assert writes(lifecycle.end(job(J.STAGED_OUT), hurry=True)) == [{"state": J.DONE}]
    assert writes(lifecycle.end(job(J.RUNNING), hurry=True)) == [{"state": J.CANCELLED}]
    assert lifecycle.end(job(J.DONE), hurry=False).actions == ()  # another teardown ended it
