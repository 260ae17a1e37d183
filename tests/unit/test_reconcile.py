"""The reconciler: dead jobs are torn down at once, missing ones only after a grace period,
stranded ones (cancelled here, waiting for a stage-in in Slurm) cancelled in Slurm, and jobs
Slurm held for a stage-in hook it killed (an empty message) released, once."""

from __future__ import annotations

import asyncio
import os
import time
from types import SimpleNamespace
from typing import Any

import pytest

from bbstage.daemon import reconcile
from bbstage.daemon.state import DirectiveState


class FakeEngine:
    """What the reconciler may use of the engine: its reads (``job``, ``jobs``) and acts
    (``end_job``, ``fail_job``); no store."""

    def __init__(self, jobs: dict[str, str], stage_in: dict[str, str] | None = None) -> None:
        self.states = jobs  # job id → its state
        self.stage_in = stage_in or {}  # job id → the state of its one stage_in directive
        self.torn: list[str] = []
        self.errors: dict[str, str] = {}
        self.made = time.time()
        self.config = SimpleNamespace(slurm_conf=None)

    def jobs(
        self, states: tuple[str, ...] | None = None, updated_since: float | None = None
    ) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(job_id=i, state=s, updated=self.made)
            for i, s in self.states.items()
            if (states is None or s in states)
            and (updated_since is None or self.made >= updated_since)
        ]

    def job(self, job_id: str) -> SimpleNamespace | None:
        if job_id not in self.states:
            return None
        states = [self.stage_in.get(job_id, "done")]
        return SimpleNamespace(
            directives=[SimpleNamespace(verb="stage_in", state=s) for s in states]
        )

    def fail_job(self, job_id: str, error: str) -> None:
        self.states[job_id] = "failed"
        self.errors[job_id] = error

    async def end_job(self, job_id: str, hurry: bool) -> None:
        assert hurry
        self.torn.append(job_id)
        self.states[job_id] = "cancelled"


SCANCELLED: list[str] = []
RELEASED: list[str] = []  # what `scontrol release` was asked, unless a test runs a fake one
REAL_RELEASE = reconcile.release_in_slurm


async def record_release(job_id: str, conf: str | None) -> bool:
    RELEASED.append(job_id)
    return True


def run(
    engine: FakeEngine,
    states: dict[str, str],
    missing: dict[str, float],
    stranded: dict[str, float] | None = None,
    released: set[str] | None = None,
) -> list[str]:
    """One pass, squeue answering ``states`` (job id → "STATE" or "STATE Reason")."""

    async def fake_states(job_ids: list[str], conf: str | None) -> dict[str, reconcile.SlurmJob]:
        return {j: reconcile.SlurmJob(*s.split(" ", 1)) for j, s in states.items()}

    async def fake_cancel(job_id: str, conf: str | None) -> bool:
        SCANCELLED.append(job_id)
        return True

    reconcile.slurm_states = fake_states  # type: ignore[assignment]
    reconcile.cancel_in_slurm = fake_cancel  # type: ignore[assignment]
    return asyncio.run(reconcile.once(engine, missing, stranded, released))  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def restore(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconcile, "slurm_states", reconcile.slurm_states)
    monkeypatch.setattr(reconcile, "cancel_in_slurm", reconcile.cancel_in_slurm)
    monkeypatch.setattr(reconcile, "release_in_slurm", record_release)  # never the real one
    SCANCELLED.clear()
    RELEASED.clear()


def test_cancelled_before_running_is_torn_down_at_once() -> None:
    engine = FakeEngine({"1": "staging_in", "2": "staging_in", "3": "staging_out"})
    torn = run(engine, {"1": "CANCELLED", "2": "PENDING", "3": "COMPLETED"}, {})
    assert torn == ["1"]  # 3 is a finished job staging out: that is normal


def test_missing_job_waits_for_the_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine({"7": "staging_in"})
    missing: dict[str, float] = {}
    clock = [1000.0]
    monkeypatch.setattr(reconcile.time, "monotonic", lambda: clock[0])
    assert run(engine, {}, missing) == []
    clock[0] += reconcile.MISSING_GRACE - 1
    assert run(engine, {}, missing) == []
    clock[0] += 2
    assert run(engine, {}, missing) == ["7"]


def test_a_job_that_reappears_is_forgiven(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine({"8": "staging_in"})
    missing: dict[str, float] = {}
    clock = [0.0]
    monkeypatch.setattr(reconcile.time, "monotonic", lambda: clock[0])
    run(engine, {}, missing)
    run(engine, {"8": "PENDING"}, missing)
    assert missing == {}
    clock[0] += reconcile.MISSING_GRACE * 2
    assert run(engine, {}, missing) == []


STAGE_IN_WAIT = "PENDING BurstBufferStageIn"


def test_a_stranded_job_is_cancelled_in_slurm_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Slurm 24.11 after a restart: it waits for a stage-in of a job it tore down itself.
    engine = FakeEngine({"9": "cancelled", "10": "cancelled"})
    stranded: dict[str, float] = {}
    clock = [0.0]
    monkeypatch.setattr(reconcile.time, "monotonic", lambda: clock[0])
    squeue = {"9": STAGE_IN_WAIT, "10": "CANCELLED None"}
    assert run(engine, squeue, {}, stranded) == []
    clock[0] += reconcile.STRANDED_GRACE - 1
    assert run(engine, squeue, {}, stranded) == []
    clock[0] += 2
    assert run(engine, squeue, {}, stranded) == ["9"]
    assert SCANCELLED == ["9"]
    assert engine.states["9"] == "failed" and "submit it again" in engine.errors["9"]
    assert engine.states["10"] == "cancelled"  # an scancel: Slurm says CANCELLED
    assert run(engine, squeue, {}, stranded) == []  # once


def test_a_job_that_stages_again_is_not_stranded(monkeypatch: pytest.MonkeyPatch) -> None:
    # Slurm's own purge after a restart: teardown, then (pending, no stage-in) setup again.
    engine = FakeEngine({"11": "cancelled"})
    stranded: dict[str, float] = {}
    clock = [0.0]
    monkeypatch.setattr(reconcile.time, "monotonic", lambda: clock[0])
    run(engine, {"11": STAGE_IN_WAIT}, {}, stranded)
    clock[0] += reconcile.STRANDED_GRACE / 2
    run(engine, {"11": "PENDING BurstBufferResources"}, {}, stranded)
    clock[0] += reconcile.STRANDED_GRACE
    assert run(engine, {"11": STAGE_IN_WAIT}, {}, stranded) == []  # the clock started again
    assert SCANCELLED == []


def test_old_cancelled_jobs_are_not_asked_about(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine({"12": "cancelled"})
    asked: list[list[str]] = []

    async def fake_states(job_ids: list[str], conf: str | None) -> dict[str, reconcile.SlurmJob]:
        asked.append(job_ids)
        return {}

    monkeypatch.setattr(reconcile, "slurm_states", fake_states)
    later = time.time() + reconcile.STRANDED_WATCH + 1
    monkeypatch.setattr(reconcile.time, "time", lambda: later)
    assert asyncio.run(reconcile.once(engine)) == []  # type: ignore[arg-type]
    assert asked == []


def test_a_job_cancelled_in_stage_in_is_torn_down_by_the_quick_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = FakeEngine({"20": "staging_in", "21": "staging_in", "22": "running"})
    asked: list[list[str]] = []

    async def fake_states(
        job_ids: list[str], conf: str | None, warn: bool = True, states_only: bool = False
    ) -> dict[str, reconcile.SlurmJob]:
        asked.append(job_ids)
        return {"20": reconcile.SlurmJob("CANCELLED"), "22": reconcile.SlurmJob("CANCELLED")}

    monkeypatch.setattr(reconcile, "slurm_states", fake_states)
    # 21 is not listed (an array task squeue cannot find yet): the whole pass judges it.
    assert asyncio.run(reconcile.stage_ins(engine)) == ["20"]  # type: ignore[arg-type]
    assert asked == [["20", "21"]]  # only the jobs being staged in
    engine.states = {"22": "running"}
    assert asyncio.run(reconcile.stage_ins(engine)) == []  # type: ignore[arg-type]
    assert len(asked) == 1  # nothing staged in: no squeue


def test_the_quick_check_runs_every_half_second_whatever_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    async def fake_once(*args: Any) -> list[str]:
        calls.append("whole")
        return []

    async def fake_stage_ins(engine: Any, pace: Any = None) -> list[str]:
        calls.append("stage_ins")
        return []

    async def purge() -> None:
        pass

    monkeypatch.setattr(reconcile, "once", fake_once)
    monkeypatch.setattr(reconcile, "stage_ins", fake_stage_ins)
    monkeypatch.setattr(reconcile, "STAGE_IN_WATCH", 0.01)
    engine = SimpleNamespace(config=SimpleNamespace(reconcile_interval=0.1), purge_expired=purge)

    async def briefly() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reconcile.forever(engine), 0.35)  # type: ignore[arg-type]

    asyncio.run(briefly())
    assert 2 <= calls.count("whole") <= 3
    assert calls.count("stage_ins") >= 15


def test_the_quick_check_tears_down_the_dead_jobs_side_by_side(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each teardown waits for its job's copies to stop: one after the other, the last job
    # of a cancelled array would copy on for the sum of those waits.
    engine = FakeEngine({str(n): "staging_in" for n in range(30, 35)})

    async def fake_states(
        job_ids: list[str], conf: str | None, warn: bool = True, states_only: bool = False
    ) -> dict[str, reconcile.SlurmJob]:
        return {j: reconcile.SlurmJob("CANCELLED") for j in job_ids}

    started: list[str] = []

    async def teardown_waiting_for_all(job_id: str, hurry: bool) -> None:
        started.append(job_id)
        while len(started) < 5:  # one at a time, the first waits here for ever
            await asyncio.sleep(0.01)
        engine.torn.append(job_id)

    async def check() -> list[str]:
        return await asyncio.wait_for(reconcile.stage_ins(engine), 10)  # type: ignore[arg-type]

    monkeypatch.setattr(reconcile, "slurm_states", fake_states)
    monkeypatch.setattr(engine, "end_job", teardown_waiting_for_all)
    assert len(asyncio.run(check())) == 5
    assert sorted(engine.torn) == [str(n) for n in range(30, 35)]


def test_a_slow_squeue_slows_the_quick_check_down(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before 24.05, squeue dumps every job of the cluster for a list of ids: on a big cluster
    # a call can take seconds, and the quick check must not keep slurmctld busy.
    engine = FakeEngine({"40": "staging_in"})
    took = 0.0

    async def fake_states(
        job_ids: list[str], conf: str | None, warn: bool = True, states_only: bool = False
    ) -> dict[str, reconcile.SlurmJob]:
        assert states_only
        await asyncio.sleep(took)
        return {}

    monkeypatch.setattr(reconcile, "slurm_states", fake_states)
    pace = reconcile.Pace()
    asyncio.run(reconcile.stage_ins(engine, pace))  # type: ignore[arg-type]
    assert pace.seconds == reconcile.STAGE_IN_WATCH
    took = 0.1
    for _ in range(reconcile.PACE_CALLS - 1):  # one fast call among the last: still fast
        asyncio.run(reconcile.stage_ins(engine, pace))  # type: ignore[arg-type]
        assert pace.seconds == reconcile.STAGE_IN_WATCH
    asyncio.run(reconcile.stage_ins(engine, pace))  # type: ignore[arg-type]
    assert 0.1 / reconcile.WATCH_SHARE <= pace.seconds < 0.2 / reconcile.WATCH_SHARE
    took = 0.0
    asyncio.run(reconcile.stage_ins(engine, pace))  # type: ignore[arg-type]
    assert pace.seconds == reconcile.STAGE_IN_WATCH  # fast again: back to every 0.5 s


def test_one_slow_squeue_does_not_slow_the_quick_check_down() -> None:
    # CI: one call slow (libraries evicted from the page cache, a busy machine) made the
    # next pause 2.5 s, and a cancel whose teardown Slurm lost took 3.3 s to stop the copy.
    pace = reconcile.Pace()
    for seconds in (0.01, 0.2, 0.01, 0.3, 0.01):
        pace.took(seconds)
        assert pace.seconds == reconcile.STAGE_IN_WATCH


def test_the_first_calls_after_a_start_do_not_slow_the_quick_check_down() -> None:
    # CI: the first squeue after the daemon started took 0.35 s (a cold page cache, a busy
    # machine); judged alone it made the next pause 7 s, and a cancel whose teardown Slurm
    # lost took 8.3 s to stop the copy. Slow is judged over PACE_CALLS calls.
    pace = reconcile.Pace()
    for _ in range(reconcile.PACE_CALLS - 1):
        pace.took(0.35)
        assert pace.seconds == reconcile.STAGE_IN_WATCH
    pace.took(0.35)
    assert pace.seconds == 0.35 / reconcile.WATCH_SHARE  # slow every time: paced


FAKE_SQUEUE = """#!/bin/sh
echo "$*" >> "$0.calls"
for a in "$@"; do
    if [ "$a" = --only-job-state ] && [ "{modern}" = no ]; then
        echo "squeue: unrecognized option '--only-job-state'" >&2
        exit 1
    fi
done
echo "50 CANCELLED None"
echo "51 PENDING BurstBufferStageIn"
"""


@pytest.mark.parametrize("modern", ["yes", "no"])
def test_the_quick_check_asks_for_states_only_where_squeue_can(
    modern: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    squeue = tmp_path / "squeue"
    squeue.write_text(FAKE_SQUEUE.format(modern=modern))
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(reconcile, "_NO_STATE_ONLY", set())

    def ask(states_only: bool) -> dict[str, reconcile.SlurmJob] | None:
        return asyncio.run(reconcile.slurm_states(["50", "51"], None, states_only=states_only))

    for _ in range(2):
        assert ask(True) == {
            "50": reconcile.SlurmJob("CANCELLED", "None"),
            "51": reconcile.SlurmJob("PENDING", "BurstBufferStageIn"),
        }
    assert ask(False) is not None
    calls = (tmp_path / "squeue.calls").read_text().splitlines()
    full = "-h -t all -j 50,51 -o %A %T %r"
    if modern == "yes":
        assert calls == ["--only-job-state -h -t all -j 50,51 -o %A %T"] * 2 + [full]
    else:  # refused once, then never asked again
        assert calls == ["--only-job-state -h -t all -j 50,51 -o %A %T", full, full, full]


def test_a_squeue_that_hangs_is_killed_and_counts_as_failed(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hung squeue must not stop the reconciler for good (the next passes still run).
    squeue = tmp_path / "squeue"
    squeue.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid\nexec sleep 30\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(reconcile, "SLURM_TIMEOUT", 0.5)
    started = time.monotonic()
    assert asyncio.run(reconcile.slurm_states(["60"], None, warn=False)) is None
    assert time.monotonic() - started < 5
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_slow_quick_check_still_runs_every_reconcile_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # However slow squeue was (slurmctld down: its retries take minutes), the jobs being
    # staged in are looked at again within reconcile_interval.
    calls: list[float] = []

    async def slow_stage_ins(engine: Any, pace: Any = None) -> list[str]:
        calls.append(time.monotonic())
        pace.seconds = 100.0  # what a call of 5 s would ask for
        return []

    async def nothing(*args: Any) -> list[str]:
        return []

    monkeypatch.setattr(reconcile, "once", nothing)
    monkeypatch.setattr(reconcile, "stage_ins", slow_stage_ins)
    engine = SimpleNamespace(config=SimpleNamespace(reconcile_interval=0.1), purge_expired=nothing)

    async def briefly() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reconcile.forever(engine), 0.55)  # type: ignore[arg-type]

    asyncio.run(briefly())
    assert len(calls) >= 3


# -- jobs Slurm held for a stage-in hook it killed (Slurm 24.11/26.05 restart race) ------------

HELD_2411 = "burst_buffer/lua: slurm_bb_test_data_in: "
HELD_2605 = "burst_buffer/lua: JobHeldAdmin: slurm_bb_data_in failed: "

FAKE_SLURM = """#!/bin/sh
echo "$(basename "$0") $* SLURM_CONF=$SLURM_CONF" >> {calls}
if [ "$(basename "$0")" = squeue ]; then cat {listing}; fi
if [ "$(basename "$0")" = scontrol ]; then exit {release_exit}; fi
"""


def fake_slurm(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, listing: str, release_exit: int = 0
) -> Any:
    """squeue printing ``listing`` and scontrol, both logging their argv; the log's path."""
    monkeypatch.delenv("SLURM_CONF", raising=False)  # scripts/test exports the cluster's
    calls, out = tmp_path / "calls", tmp_path / "listing"
    out.write_bytes(listing.encode())
    for tool in ("squeue", "scontrol"):
        script = tmp_path / tool
        script.write_text(FAKE_SLURM.format(calls=calls, listing=out, release_exit=release_exit))
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(reconcile, "release_in_slurm", REAL_RELEASE)  # runs the fake scontrol
    return calls


def scan(engine: FakeEngine, released: set[str]) -> list[str]:
    return asyncio.run(reconcile.held(engine, released))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "reason",
    [
        pytest.param(HELD_2411, id="2411"),
        pytest.param(HELD_2605, id="2605"),
        pytest.param(HELD_2605.rstrip() + " \t ", id="2605-trailing-whitespace"),
        # killed after it had answered a poll's "not yet" (CI, 2026-11-28)
        pytest.param(HELD_2605.replace("data_in", "test_data_in") + "BUSY", id="2605-busy"),
        pytest.param(HELD_2411 + "BUSY", id="2411-busy"),
    ],
)
def test_a_job_slurm_held_for_a_stage_in_hook_it_killed_is_released(
    reason: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 70: torn down here (Slurm's TeardownFailure teardown: its copy cancelled, no failure);
    # 71: unknown to the daemon (e.g. setup killed before it reached it).
    engine = FakeEngine({"70": "cancelled"}, stage_in={"70": "cancelled"})
    engine.config.slurm_conf = "/etc/slurm-test/slurm.conf"
    calls = fake_slurm(tmp_path, monkeypatch, f"70 PENDING {reason}\n71 PENDING {reason}\n")
    assert scan(engine, set()) == ["70", "71"]
    conf = "SLURM_CONF=/etc/slurm-test/slurm.conf"
    assert calls.read_text().splitlines() == [
        f"squeue -h -t PD -o %A %T %r {conf}",
        f"scontrol release 70 {conf}",
        f"scontrol release 71 {conf}",
    ]


@pytest.mark.parametrize(
    "reason",
    [
        # a failure bbstage answered: Slurm shows its message
        pytest.param(
            "burst_buffer/lua: JobHeldAdmin: slurm_bb_test_data_in failed: stage_in line 2: gone",
            id="message-2605",
        ),
        pytest.param(
            "burst_buffer/lua: slurm_bb_data_in: job 72 is unknown to the staging daemon",
            id="message-2411",
        ),
        # an admin's `scontrol hold`, a user's `scontrol hold`
        pytest.param("JobHeldAdmin", id="admin-hold"),
        pytest.param("JobHeldUser", id="user-hold"),
        # a failure whose message only begins or ends with the word of a poll's "not yet"
        pytest.param(HELD_2605 + "BUSY disk", id="busy-and-more"),
        pytest.param(HELD_2605 + "not BUSY", id="more-and-busy"),
        # an empty failure of a hook that is not a stage-in hook
        pytest.param("burst_buffer/lua: JobHeldAdmin: slurm_bb_pre_run failed: ", id="pre-run"),
        # the reason Slurm gives while it stages the job in
        pytest.param("BurstBufferStageIn", id="staging-in"),
    ],
)
def test_a_job_held_for_a_real_reason_stays_held(
    reason: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeEngine({"78": "cancelled"}, stage_in={"78": "cancelled"})
    calls = fake_slurm(tmp_path, monkeypatch, f"72 PENDING {reason}\n78 PENDING {reason}\n")
    assert scan(engine, set()) == []
    assert calls.read_text().splitlines() == ["squeue -h -t PD -o %A %T %r SLURM_CONF="]
    # The whole pass's squeue (the daemon's own jobs) lists every reason: the same verdict.
    assert run(engine, {"78": f"PENDING {reason}"}, {}, {}, set()) == []
    assert calls.read_text().splitlines() == ["squeue -h -t PD -o %A %T %r SLURM_CONF="]


def test_a_job_whose_stage_in_failed_here_stays_held() -> None:
    # The daemon recorded a failed stage-in for the job: whatever the reason says, its own
    # failure is what holds the job, and a release would only fail it again.
    engine = FakeEngine({"73": "failed"}, stage_in={"73": DirectiveState.FAILED})
    released: set[str] = set()
    slurm = {"73": reconcile.SlurmJob("PENDING", HELD_2605)}
    assert asyncio.run(reconcile.release_held(engine, slurm, released, None)) == []  # type: ignore[arg-type]
    assert released == set() and RELEASED == []


def test_a_job_that_is_not_pending_is_not_released() -> None:
    # A held job cancelled since keeps its reason; nothing to release.
    engine = FakeEngine({})
    slurm = {"74": reconcile.SlurmJob("CANCELLED", HELD_2411)}
    assert asyncio.run(reconcile.release_held(engine, slurm, set(), None)) == []  # type: ignore[arg-type]
    assert RELEASED == []


@pytest.mark.parametrize("release_exit", [0, 1])
def test_a_held_job_is_released_once(
    release_exit: int, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Held again after the release (or a release slurmctld refused): no loop, an admin acts.
    engine = FakeEngine({})
    calls = fake_slurm(tmp_path, monkeypatch, f"75 PENDING {HELD_2605}\n", release_exit)
    released: set[str] = set()
    assert scan(engine, released) == ([] if release_exit else ["75"])
    assert scan(engine, released) == []
    assert scan(engine, released) == []
    releases = [c for c in calls.read_text().splitlines() if c.startswith("scontrol")]
    assert releases == ["scontrol release 75 SLURM_CONF="]


def test_the_whole_pass_releases_a_held_job_it_tore_down() -> None:
    # The jobs the daemon tore down lately are asked about every pass anyway: no extra squeue.
    engine = FakeEngine({"76": "cancelled", "77": "cancelled"}, stage_in={"76": "cancelled"})
    released: set[str] = set()
    squeue = {"76": f"PENDING {HELD_2411}", "77": "PENDING JobHeldUser"}
    assert run(engine, squeue, {}, {}, released) == ["76"]
    assert run(engine, squeue, {}, {}, released) == []
    assert RELEASED == ["76"]


def test_the_held_scan_is_paced_like_the_quick_check() -> None:
    # A cluster whose pending jobs take long to list is listed less often.
    pace = reconcile.Pace(reconcile.HELD_SCAN)
    assert pace.seconds == reconcile.HELD_SCAN
    for _ in range(reconcile.PACE_CALLS):
        pace.took(10.0)
    assert pace.seconds == 10.0 / reconcile.WATCH_SHARE
