"""[K] I5 on the real cluster: a script saved as Latin-1 stages byte for byte (22.05, 24.11).

A Latin-1 byte in a comment once held the job in PENDING for ever ("bad request: request is not
JSON"). Now the job completes, and a Latin-1 path names the file with exactly that byte;
where bytes cannot be used (an S3 key) sbatch fails with the line.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers import file_digest, wait_until

from .conftest import USER, Cluster, as_user

pytestmark = pytest.mark.cluster

E9 = b"\xe9"  # Latin-1 "é"; not UTF-8


def sbatch(cluster: Cluster, workdir: Path, script: bytes) -> subprocess.CompletedProcess[bytes]:
    path = workdir / f"job-{uuid.uuid4().hex[:6]}.sh"
    path.write_bytes(script)
    path.chmod(0o644)
    argv = ["sbatch", "--parsable", f"--chdir={workdir}", f"--output={workdir}/slurm-%j.out"]
    return subprocess.run(
        ["runuser", "-u", USER, "--", *argv, str(path)],
        env=cluster.env, capture_output=True, timeout=60,
    )  # fmt: skip


def submit(cluster: Cluster, workdir: Path, script: bytes) -> str:
    proc = sbatch(cluster, workdir, script)
    assert proc.returncode == 0, proc.stderr.decode(errors="backslashreplace")
    return proc.stdout.decode().strip().split(";")[0]


def job_info(cluster: Cluster, job_id: str) -> dict[str, str]:
    """``scontrol show job`` fields; it prints the burst buffer spec's bytes as they are."""
    out = subprocess.run(
        ["scontrol", "show", "job", job_id], env=cluster.env, capture_output=True, timeout=60
    ).stdout.decode(errors="backslashreplace")
    return dict(re.findall(r"(\w+)=(\S*)", out))


def wait_gone(cluster: Cluster, job_id: str, timeout: float = 180) -> dict[str, str]:
    """Until the job finished and its teardown ran (as Cluster.wait_gone)."""

    def gone() -> dict[str, str] | None:
        info = job_info(cluster, job_id)
        if info.get("JobState") in ("COMPLETED", "CANCELLED", "FAILED") and info.get(
            "BurstBufferState", ""
        ) in ("", "complete", "teardown-complete"):
            return info
        assert "_bad_request" not in info.get("Reason", ""), info
        return None

    return wait_until(
        gone, timeout, lambda: f"job {job_id} to end; it is {job_info(cluster, job_id)}", every=0.2
    )


def test_latin1_comment_and_path_stage_byte_for_byte(cluster: Cluster, workdir: Path) -> None:
    w = bytes(workdir)
    src, out = w + b"/src", w + b"/out"
    os.mkdir(src)
    os.mkdir(out)
    plain, latin = b"in.dat", b"r" + E9 + b"sultat.dat"
    for name in (plain, latin):
        with open(src + b"/" + name, "wb") as f:
            f.write(os.urandom(300_000))
    as_user(workdir)
    # A Latin-1 byte only in a comment and in the job's commands; every path is ASCII.
    comment = submit(
        cluster,
        workdir,
        b"#!/bin/bash\n# r" + E9 + b"sultat: saved as ISO-8859-1\n"
        b"#BB_LUA stage_in source=" + src + b"/" + plain + b" destination=$BB_SCRATCH/in.dat\n"
        b"#BB_LUA stage_out source=$BB_SCRATCH/in.dat destination=" + out + b"/in.dat\n"
        b"echo r" + E9 + b"sultat > /dev/null\n",
    )
    # A Latin-1 byte in the paths: the staged files are named with exactly that byte.
    path = submit(
        cluster,
        workdir,
        b"#!/bin/bash\n"
        b"#BB_LUA stage_in source=" + src + b"/" + latin + b" destination=$BB_SCRATCH/" + latin
        + b"\n#BB_LUA stage_out source=$BB_SCRATCH/" + latin + b" destination=" + out + b"/"
        + latin + b"\nsha256sum \"$BB_SCRATCH/" + latin + b"\" | cut -d' ' -f1 > inside.txt\n",
    )  # fmt: skip
    for job in (comment, path):
        info = wait_gone(cluster, job)
        assert info["JobState"] == "COMPLETED", info
    assert file_digest(out + b"/in.dat") == file_digest(src + b"/" + plain)
    assert sorted(os.listdir(out)) == sorted([b"in.dat", latin])
    assert file_digest(out + b"/" + latin) == file_digest(src + b"/" + latin)
    assert (workdir / "inside.txt").read_text().strip() == file_digest(src + b"/" + latin)
    assert cluster.status(path)["state"] == "done"
    shown = cluster.bbstage("status", path)  # human output: the byte shown as \xe9
    assert shown.returncode == 0 and "r\\xe9sultat.dat" in shown.stdout, shown.stderr


def test_latin1_s3_key_fails_at_sbatch_with_its_line(cluster: Cluster, workdir: Path) -> None:
    proc = sbatch(
        cluster,
        workdir,
        b"#!/bin/bash\n#BB_LUA stage_in source=/etc/hostname destination=$BB_SCRATCH/h\n"
        b"#BB_LUA stage_out source=$BB_SCRATCH/h destination=s3://bucket/r" + E9 + b"s\n"
        b"true\n",
    )
    assert proc.returncode != 0
    assert b'line 3: stage_out: byte 0xe9 in destination "s3://bucket/r\xe9s"' in proc.stderr
