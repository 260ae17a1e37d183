"""[H] What differs between the Slurm generations, on the real clusters (docs/slurm-versions.md).

22.05: data_in blocks until staged; only setup knows the job's owner; get_status does not
know who asks. 24.05+ (run here on 24.11): data_in returns at once and slurmctld polls
test_data_in every PollInterval; every hook carries uid/gid and most a job_info table;
get_status gets the caller's uid.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
from pathlib import Path

import pytest

from bbstage.daemon import reconcile
from tests.helpers import make_tree, wait_until

from .conftest import OTHER, USER, Cluster, as_user

# Also on the middle generations (24.11): the smoke subset of their hook API (conftest.py).
pytestmark = [pytest.mark.cluster, pytest.mark.every_generation]


def daemon_log(cluster: Cluster, job: str) -> list[dict]:
    """The daemon's JSON log records about one job, in order."""
    records = []
    for line in (cluster.dir / "log" / "bbstage.log").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and str(record.get("job_id")) == job:
            records.append(record)
    return records


def test_hooks_carry_the_owner_and_24_11_submits_then_polls(
    cluster: Cluster, workdir: Path
) -> None:
    # Long enough to be polled: Slurm calls test_data_in right after data_in, and a stage-in
    # done by then is answered from the daemon's mark, without a request (300 x 64 KiB from
    # the page cache were staged before that first poll in CI, 2026-11-29). 300 MiB, read
    # from the disk, take some 0.2 s or more; the stage-out (from the page cache) as long.
    src = make_tree(workdir / "src", 300, 1 << 20, digits=3, fill="rotated")
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    as_user(workdir)
    job = cluster.submit(
        workdir,
        f"#!/bin/bash\n#BB_LUA stage_in source={src}/ destination={workdir}/in/\n"
        f"#BB_LUA stage_out source={workdir}/in/ destination={workdir}/out/\n"
        f"ls {workdir}/in | wc -l > count.txt\n",
    )
    cluster.wait_gone(job)
    assert cluster.job(job)["JobState"] == "COMPLETED"
    assert (workdir / "count.txt").read_text().strip() == "300"
    assert len(os.listdir(workdir / "out")) == 300

    records = daemon_log(cluster, job)
    requests = [r for r in records if r.get("event") == "hook"]
    replies = [(r["hook"], r["status"]) for r in requests]
    uid = pwd.getpwnam(USER).pw_uid
    owners = {r["hook"]: r.get("uid") for r in requests}
    if cluster.slurm == "22.05":
        # Only setup knows the owner; data_in answers when staged, nothing polls.
        assert str(owners["setup"]) == str(uid)
        assert all(owners[h] is None for h in ("data_in", "pre_run", "data_out", "teardown"))
        assert not any(h.startswith("test_data") for h, _ in replies), replies
        return
    # 24.11: every hook carries the owner (a daemon that lost setup could still create the job).
    assert set(owners) >= {"setup", "data_in", "test_data_in", "pre_run", "data_out", "teardown"}
    assert all(str(owner) == str(uid) for owner in owners.values()), owners
    # Submit and poll: data_in answered before the transfer was done, then test_data_in
    # was polled (BUSY at least once) until ok; the same for stage-out. Once the stage-in
    # is done, test_data_in answers from the daemon's mark, without a request.
    events = [(r.get("hook"), r.get("event"), r.get("status")) for r in records]
    first_done = events.index((None, "transfer done", None))
    assert events.index(("data_in", "hook", "ok")) < first_done, events
    for direction in ("in", "out"):
        polls = [s for h, s in replies if h == f"test_data_{direction}"]
        assert "busy" in polls and set(polls) <= {"busy", "ok"}, (direction, polls)
    assert ("test_data_out", "ok") in replies, replies
    # job_info: nodes arrive with pre_run.
    starts = [r for r in records if r.get("event") == "job starts"]
    assert [r["nodes"] for r in starts] == ["localhost"]


def test_bbstat_shows_paths_only_to_their_owner(cluster: Cluster, workdir: Path) -> None:
    other_dir = workdir / "other"
    other_dir.mkdir()
    (workdir / "mine.txt").write_text("mine\n")
    (other_dir / "theirs.txt").write_text("theirs\n")
    as_user(workdir)
    as_user(other_dir, OTHER)
    workdir.chmod(0o755)
    mine = cluster.submit(
        workdir,
        f"#!/bin/bash\n#BB_LUA stage_in source={workdir}/mine.txt destination={workdir}/m2\n",
    )
    theirs = cluster.submit(
        other_dir,
        f"#!/bin/bash\n#BB_LUA stage_in source={other_dir}/theirs.txt destination={other_dir}/t2\n",
        user=OTHER,
    )
    cluster.wait_gone(mine)
    cluster.wait_gone(theirs)
    as_me = cluster.run("scontrol", "show", "bbstat", mine, theirs, user=USER)
    as_other = cluster.run("scontrol", "show", "bbstat", mine, theirs, user=OTHER)
    # Both see both jobs' states...
    for out in (as_me, as_other):
        assert f"{mine:>8} done" in out and f"{theirs:>8} done" in out, out
    # ...but paths only where Slurm says who asks (24.05+), and then only their own.
    if cluster.slurm == "22.05":
        assert "mine.txt" not in as_me + as_other and "theirs.txt" not in as_me + as_other
    else:
        assert "mine.txt" in as_me and "theirs.txt" not in as_me, as_me
        assert "theirs.txt" in as_other and "mine.txt" not in as_other, as_other
    # Nobody gets another user's paths by passing that user's uid and gid as arguments.
    them = pwd.getpwnam(OTHER)
    spoof = cluster.run(
        "scontrol", "show", "bbstat", str(them.pw_uid), str(them.pw_gid), theirs, user=USER
    )
    assert "theirs.txt" not in spoof, spoof
    shutil.rmtree(other_dir, ignore_errors=True)


def test_every_task_of_a_job_array_gets_its_scratch(cluster: Cluster, workdir: Path) -> None:
    """Slurm >= 23.02 writes a split-off array task's paths file into a directory it never
    creates; setup creates it (bbstage/daemon/slurmdirs.py), else those tasks are held
    unexplained."""
    data = os.urandom(100_000)
    (workdir / "in.dat").write_bytes(data)
    as_user(workdir)
    script = workdir / "array.sh"
    script.write_text(
        "#!/bin/bash\n#BB_LUA pool=scratch capacity=1M\n"
        f"#BB_LUA stage_in source={workdir}/in.dat destination=$BB_SCRATCH/in.dat\n"
        f'cp "$BB_SCRATCH/in.dat" "{workdir}/out_$SLURM_ARRAY_TASK_ID.dat"\n'
    )
    script.chmod(0o644)
    out = cluster.run(
        "sbatch", "--parsable", "--array=0-2", f"--chdir={workdir}",
        f"--output={workdir}/slurm-%A_%a.out", str(script), user=USER,
    )  # fmt: skip
    array = out.strip().split(";")[0]
    for task in range(3):
        cluster.wait_gone(f"{array}_{task}", timeout=180)
        assert cluster.job(f"{array}_{task}")["JobState"] == "COMPLETED", cluster.job(
            f"{array}_{task}"
        )
        assert (workdir / f"out_{task}.dat").read_bytes() == data


def test_the_reconciler_reads_the_same_states_either_way(
    cluster: Cluster, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The quick check asks for states only (24.11: squeue --only-job-state, the job-state
    # RPC; 22.05 refuses the option and gets the full query): the same states either way.
    monkeypatch.setenv("PATH", cluster.env["PATH"])
    monkeypatch.setattr(reconcile, "_NO_STATE_ONLY", set())
    conf = cluster.env.get("SLURM_CONF")
    running = cluster.submit(workdir, "#!/bin/bash\nsleep 60\n")
    cancelled = cluster.submit(workdir, "#!/bin/bash\n#SBATCH --begin=now+1hour\nsleep 1\n")
    # A job array: a task that ran has its own id (%A); one of them cancelled.
    array = cluster.submit(workdir, "#!/bin/bash\n#SBATCH --array=0-3\nsleep 60\n")
    cluster.run("scancel", cancelled)
    cluster.wait_state(running, "RUNNING")
    cluster.wait_state(cancelled, "CANCELLED")

    def task(state: str) -> list[str]:  # [its own id, ARRAY_INDEX] or []
        out = cluster.run("squeue", "-h", "-r", "-t", state, "-j", array, "-o", "%A %i")
        return out.split()[:2]

    # By ARRAY_INDEX: 22.05's scancel refuses a task's own id ("Invalid job id specified").
    started, index = wait_until(lambda: task("R"), 60, "a task of the array running")
    cluster.run("scancel", index)
    cluster.wait_state(started, "CANCELLED")
    tasks = cluster.run("squeue", "-h", "-r", "-t", "all", "-j", array, "-o", "%A").split()
    try:
        ids = [running, cancelled, *tasks, "99999998"]

        def states(states_only: bool) -> dict[str, str] | None:
            got = asyncio.run(reconcile.slurm_states(ids, conf, states_only=states_only))
            return None if got is None else {j: s.state for j, s in got.items()}

        want = states(False)
        assert want is not None and len(want) == 2 + len(set(tasks))
        assert (want[running], want[cancelled]) == ("RUNNING", "CANCELLED")
        assert want[started] == "CANCELLED" and started in tasks
        assert states(True) == want
        refused = bool(reconcile._NO_STATE_ONLY)
        assert refused == (cluster.slurm == "22.05")
        # None of the ids known any more: an empty answer, not a failure.
        ids = ["99999998", "99999999"]
        assert states(True) == {} and states(False) == {}
    finally:
        cluster.run("scancel", running, array, check=False)
