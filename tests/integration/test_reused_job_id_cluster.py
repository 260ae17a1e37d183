"""A reused job id never hands over or deletes another user's kept scratch (audit #2), on the
real cluster: slurmctld is cold-started (``-c``: its saved jobs and next job id dropped), so
Slurm hands the same job id to another user's job.

The cold start forgets every job slurmctld knows: the jobs that come after reuse ids the
daemon has records of, which is what it must handle anyway (finished records are replaced)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.helpers import file_digest, process_gone, wait_until

from .conftest import OTHER, USER, Cluster, as_user


def _cold_start(cluster: Cluster, first_job_id: str) -> None:
    """Stop slurmctld and start it again with ``-c`` (its jobs forgotten), so that its next
    job id is ``first_job_id``, the way scripts/local-cluster starts it (chrooted into the
    generation's root but for 22.05).

    ``-c`` alone does not reuse ids: a cold start (``recover == 0`` in ``read_slurm_conf``)
    still calls ``load_last_job_id()``, which reads the id sequence from the ``job_state``
    file's header, and ``reset_first_job_id()`` only raises it to FirstJobId (seen on 22.05:
    after ``-c`` with FirstJobId=45 the next job was 46). So the saved ``job_state`` files
    are removed (``-c`` drops their jobs anyway) and FirstJobId is set to the kept job's id
    for that start; slurm.conf is put back as it was only once slurmctld answers (it is
    read after slurmctld has daemonized), so ``local-cluster up`` sees no change."""
    pid = int((cluster.dir / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: process_gone(pid), 60, f"slurmctld (pid {pid}) to end")
    for name in ("job_state", "job_state.old", "job_state.new"):
        (cluster.dir / "spool" / "ctld" / name).unlink(missing_ok=True)
    conf = Path(cluster.env["SLURM_CONF"])
    argv = ["slurmctld", "-f", str(conf), "-c"]
    if cluster.slurm != "22.05":
        root = f"/var/tmp/bbstage-slurm-{cluster.slurm}-root"
        argv = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
                "chroot", root, *argv]  # fmt: skip
    text = conf.read_text()
    conf.write_text(f"{text}FirstJobId={first_job_id}\n")
    try:
        with open(cluster.dir / "log" / "slurmctld.log", "ab") as log:
            subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=True)
        wait_until(
            lambda: cluster.run("scontrol", "ping", check=False).count("UP") > 0,
            60,
            "slurmctld to answer",
        )
    finally:
        conf.write_text(text)


def test_a_reused_job_id_never_hands_over_kept_scratch(cluster: Cluster, workdir: Path) -> None:
    (workdir / "results").mkdir()
    as_user(workdir)
    os.chmod(workdir, 0o755)
    # User 1's stage-out from scratch fails (its destination is a directory it cannot
    # write): the scratch is kept, with the results, for retention_days.
    denied = workdir / "denied"
    denied.mkdir(mode=0o700)  # root's
    first = cluster.submit(
        workdir,
        "#!/bin/bash\n"
        f"#BB_LUA stage_out source=$BB_SCRATCH/out.dat destination={denied}/out.dat\n"
        'head -c 100000 /dev/urandom > "$BB_SCRATCH/out.dat"\n'
        f'sha256sum "$BB_SCRATCH/out.dat" | cut -d" " -f1 > {workdir}/first.sha\n'
        'echo "$BB_SCRATCH" > ' + f"{workdir}/first.scratch\n",
    )
    cluster.wait_gone(first, timeout=180)
    assert "outputs kept in" in cluster.status(first)["error"]
    scratch = Path((workdir / "first.scratch").read_text().strip())
    assert scratch.name == first and (scratch / "out.dat").exists()
    results = file_digest(scratch / "out.dat")
    assert results == (workdir / "first.sha").read_text().strip()

    # Job ids start again: submit as user 2 until one gets the kept job's id.
    _cold_start(cluster, first)
    other = workdir / "other"
    other.mkdir()
    as_user(other, OTHER)
    probe = (
        "#!/bin/bash\n#BB_LUA stage_in source=/etc/hostname destination=$BB_SCRATCH/h\n"
        f'ls -A "$BB_SCRATCH" > {other}/seen.$SLURM_JOB_ID; stat -c %U "$BB_SCRATCH"'
        f" >> {other}/seen.$SLURM_JOB_ID\n"
    )
    reused = None
    for _ in range(5):  # the first is the one, unless something else was submitted
        job = cluster.submit(other, probe, user=OTHER)
        if job == first:
            reused = job
            break
        cluster.run("scancel", job)
    assert reused is not None, f"slurmctld -c never handed out job id {first} again"
    cluster.wait_gone(reused, timeout=180)
    assert cluster.job(reused)["JobState"] == "COMPLETED"
    # User 2 saw a fresh directory of its own, holding only what it staged.
    assert (other / f"seen.{reused}").read_text().split() == ["h", OTHER]
    # User 1's results: set aside, still theirs, byte for byte; not removed by the teardown.
    [kept] = [p for p in scratch.parent.iterdir() if p.name.startswith(f"{first}.kept-")]
    assert kept.stat().st_uid == int(cluster.run("id", "-u", USER).strip())
    assert oct(kept.stat().st_mode & 0o777) == oct(0o700)
    assert file_digest(kept / "out.dat") == results
    assert not scratch.exists()  # user 2's scratch went with its teardown
    cluster.up()
