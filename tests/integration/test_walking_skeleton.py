"""[A] A #BB_LUA job on the real cluster, staged by the daemon as the job's user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import file_digest, make_tree, wait_until

from .conftest import USER, Cluster, as_user

# Also on the middle generations (24.11): the smoke subset of their hook API (conftest.py).
pytestmark = [pytest.mark.cluster, pytest.mark.every_generation]


def test_job_stages_inputs_in_and_outputs_out(cluster: Cluster, workdir: Path) -> None:
    data, fast = workdir / "data", workdir / "fast"
    (data / "refs" / "sub").mkdir(parents=True)
    fast.mkdir()
    (data / "input.dat").write_bytes(os.urandom(3 << 20))
    for i in range(20):
        (data / "refs" / "sub" / f"r{i}.txt").write_text(f"ref {i}\n" * 100)
    as_user(workdir)
    job = cluster.submit(
        workdir,
        f"""#!/bin/bash
#BB_LUA stage_in source={data}/input.dat destination={fast}/input.dat
#BB_LUA stage_in source={data}/refs/ destination={fast}/refs/
#BB_LUA stage_out source={fast}/result.dat destination={data}/result.dat
test -f {fast}/input.dat || exit 3
cat {fast}/input.dat {fast}/refs/sub/r7.txt > {fast}/result.dat
""",
    )
    cluster.wait_gone(job)
    assert cluster.job(job)["JobState"] == "COMPLETED"
    assert file_digest(fast / "input.dat") == file_digest(data / "input.dat")
    assert (fast / "refs" / "sub" / "r19.txt").read_text() == "ref 19\n" * 100
    expected = (data / "input.dat").read_bytes() + (data / "refs/sub/r7.txt").read_bytes()
    assert (data / "result.dat").read_bytes() == expected
    # Copied as the user, never as root.
    assert (fast / "input.dat").stat().st_uid == (data / "result.dat").stat().st_uid != 0

    status = cluster.status(job)
    assert status["state"] == "done"
    assert [(d["direction"], d["state"]) for d in status["directives"]] == [
        ("in", "done"),
        ("in", "done"),
        ("out", "done"),
    ]
    assert status["directives"][1]["files_total"] == 20
    human = cluster.bbstage("status", job)
    assert human.returncode == 0 and f"{data}/refs/ -> {fast}/refs/" in human.stdout


def test_missing_source_holds_the_job_naming_the_path(cluster: Cluster, workdir: Path) -> None:
    missing = workdir / "no-such-input.dat"
    job = cluster.submit(
        workdir,
        f"""#!/bin/bash
#BB_LUA stage_in source={missing} destination={workdir}/in.dat
true
""",
    )
    try:
        info = cluster.wait(job, lambda j: str(missing) in j.get("Reason", ""), timeout=60)
        assert "no such file or directory" in info["Reason"]
        assert info["JobState"] == "PENDING"
        assert cluster.bbstage("status", job).returncode == 1  # staging failed
    finally:
        cluster.run("scancel", job)


def test_bad_directive_fails_sbatch_with_the_line(cluster: Cluster, workdir: Path) -> None:
    err = cluster.sbatch_error(
        workdir,
        "#!/bin/bash\n#SBATCH -t 1\n#BB_LUA stage_in source=data/x destination=/tmp/x\ntrue\n",
    )
    assert "line 3" in err and "relative path" in err, err


def test_scancel_during_stage_in_cleans_up(cluster: Cluster, workdir: Path) -> None:
    src = make_tree(workdir / "many", 6000, 256 << 10, fill="same")
    with open(src / "zbig", "wb") as f:  # sparse: its copy takes seconds, the tree's not
        f.truncate(16 << 30)
    as_user(workdir)
    dst = workdir / "dst"
    job = cluster.submit(
        workdir,
        f"#!/bin/bash\n#BB_LUA stage_in source={src}/ destination={dst}/\ntrue\n",
    )
    cluster.wait(
        job,
        lambda j: _status_running(cluster, job),
        timeout=60,
    )
    cluster.run("scancel", job)
    # Slurm may kill the teardown hook it starts on scancel during stage-in; then the
    # daemon's own check of the jobs being staged in notices and tears down itself.
    wait_until(
        lambda: cluster.status(job)["state"] == "cancelled",
        30,
        lambda: f"the job's state cancelled; its status: {cluster.status(job)}",
        every=0.2,
    )
    leftovers = [p for p in dst.rglob("*") if ".bbstage-" in p.name]
    assert leftovers == []
    assert not (dst / "zbig").exists()  # aborted, not finished


def _status_running(cluster: Cluster, job: str) -> bool:
    result = cluster.bbstage("status", "--json", job)
    return (
        result.returncode == 0
        and '"bytes_done": 0,' not in result.stdout
        and ('"state": "running"' in result.stdout)
    )


def test_job_sees_its_scratch_directory(cluster: Cluster, workdir: Path) -> None:
    job = cluster.submit(
        workdir,
        "#!/bin/bash\n#BB_LUA pool=scratch capacity=8M\n"
        'stat -c "%U %a" "$BB_SCRATCH" > scratch.txt; echo "$BB_SCRATCH" >> scratch.txt\n',
    )
    cluster.wait_gone(job)
    owner_mode, path = (workdir / "scratch.txt").read_text().split("\n")[:2]
    assert owner_mode == f"{USER} 700"
    assert path.endswith(f"/{job}")
    assert not Path(path).exists()  # removed at teardown
