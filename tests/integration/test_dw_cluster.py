"""DataWarp and NNF job scripts (#DW lines) and late staging lines, through real sbatch.

The shared local clusters keep Slurm's default ``Directive=BB_LUA``, under which a job is a
burst-buffer job only with a ``#BB_LUA`` line (docs/install.md): each #DW script here has a
bare ``#BB_LUA`` line, and its #DW lines do all the staging. ``Directive=DW`` itself is not
exercised here (it would turn the other tests' jobs into ordinary jobs).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import file_digest, make_tree, tree_digests

from .conftest import Cluster, as_user

pytestmark = pytest.mark.cluster


def _inputs(workdir: Path) -> tuple[Path, Path]:
    src = workdir / "src"
    src.mkdir()
    (src / "in.dat").write_bytes(os.urandom(3 << 20) + b"\xe9 end")
    make_tree(src / "tree", 40, 64 << 10, sub="deeper")
    out = workdir / "out"
    out.mkdir()
    as_user(workdir)
    return src, out


def _check(cluster: Cluster, job: str, src: Path, out: Path) -> None:
    cluster.wait_gone(job, timeout=180)
    assert cluster.job(job)["JobState"] == "COMPLETED"
    # in, through the job (it copies scratch's inputs to its outputs), and out: the same bytes
    assert file_digest(out / "out.dat") == file_digest(src / "in.dat")
    assert tree_digests(out / "outtree") == tree_digests(src / "tree")
    assert len(tree_digests(out / "outtree")) == 40
    # the job's environment had the #DW names, all the job's scratch directory
    names = dict(line.split("=", 1) for line in (out / "env.txt").read_text().splitlines())
    assert names["BB_SCRATCH"].endswith(f"/{job}")
    assert set(names.values()) == {names["BB_SCRATCH"]}, names


def test_datawarp_script_stages_file_and_directory(cluster: Cluster, workdir: Path) -> None:
    src, out = _inputs(workdir)
    job = cluster.submit(
        workdir,
        "#!/bin/bash\n#SBATCH -N 1\n#BB_LUA\n"
        "#DW jobdw access_mode=striped type=scratch\n"
        f"#DW stage_in source={src}/in.dat destination=$DW_JOB_STRIPED/in.dat type=file\n"
        f"#DW stage_in source={src}/tree destination=$DW_JOB_STRIPED/tree type=directory\n"
        f"#DW stage_out source=$DW_JOB_STRIPED/out.dat destination={out}/out.dat type=file\n"
        f"#DW stage_out source=$DW_JOB_STRIPED/outtree destination={out}/outtree "
        "type=directory\n"
        "set -e\n"
        "cp $DW_JOB_STRIPED/in.dat $DW_JOB_STRIPED/out.dat\n"
        "cp -r $DW_JOB_STRIPED/tree $DW_JOB_STRIPED/outtree\n"
        f"printf 'BB_SCRATCH=%s\\nDW_JOB_STRIPED=%s\\nDW_JOB_PRIVATE=%s\\n' \"$BB_SCRATCH\" "
        f'"$DW_JOB_STRIPED" "$DW_JOB_PRIVATE" > {out}/env.txt\n',
    )
    _check(cluster, job, src, out)


def test_nnf_script_stages_file_and_directory(cluster: Cluster, workdir: Path) -> None:
    src, out = _inputs(workdir)
    job = cluster.submit(
        workdir,
        "#!/bin/bash\n#SBATCH -N 1\n#BB_LUA\n"
        "#DW jobdw type=xfs capacity=1GiB name=fast-storage pool=scratch\n"
        f"#DW copy_in source={src}/in.dat destination=$DW_JOB_fast_storage/in.dat\n"
        f"#DW copy_in source={src}/tree/ destination=$DW_JOB_fast_storage/tree/\n"
        f"#DW copy_out source=$DW_JOB_fast_storage/out.dat destination={out}/out.dat\n"
        f"#DW copy_out source=$DW_JOB_fast_storage/outtree/ destination={out}/outtree/\n"
        "set -e\n"
        "cp $DW_JOB_fast_storage/in.dat $DW_JOB_fast_storage/out.dat\n"
        "cp -r $DW_JOB_fast_storage/tree $DW_JOB_fast_storage/outtree\n"
        f"printf 'BB_SCRATCH=%s\\nDW_JOB_fast_storage=%s\\nDW_JOB_STRIPED=%s\\n' "
        f'"$BB_SCRATCH" "$DW_JOB_fast_storage" "$DW_JOB_STRIPED" > {out}/env.txt\n',
    )
    _check(cluster, job, src, out)


def test_persistentdw_is_refused_at_sbatch_with_the_line(cluster: Cluster, workdir: Path) -> None:
    err = cluster.sbatch_error(
        workdir, "#!/bin/bash\n#BB_LUA\n#DW persistentdw name=shared-data\ntrue\n"
    )
    assert (
        "line 3: #DW persistentdw: persistent burst buffers do not exist with bbstage: stage "
        "the data from the shared file system in each job" in err
    ), err


def test_late_line_is_logged_and_the_job_accepted(cluster: Cluster, workdir: Path) -> None:
    """The job runs and stages its header's line; the late one is in slurmctld's log. No
    generation's burst_buffer/lua can tell the sbatch user (docs/install.md): 25.11+ define
    slurm.log_user but not the slurm.user_msg it calls, and the hook must not die of it."""
    (workdir / "in.dat").write_bytes(b"early\n")
    as_user(workdir)
    log = cluster.dir / "log" / "slurmctld.log"
    start = log.stat().st_size
    job = cluster.submit(
        workdir,
        f"#!/bin/bash\n#BB_LUA stage_in source={workdir}/in.dat destination={workdir}/a.dat\n"
        "true\n"
        f"#BB_LUA stage_out source={workdir}/a.dat destination={workdir}/late.dat\n",
    )
    cluster.wait_gone(job)
    assert cluster.job(job)["JobState"] == "COMPLETED"
    assert (workdir / "a.dat").read_bytes() == b"early\n"
    assert not (workdir / "late.dat").exists()
    with log.open("rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    assert (
        "line 4: #BB_LUA line after the first command (line 3) is ignored by Slurm: move it "
        "above line 3" in text
    ), text[-3000:]
    assert "user_msg" not in text
