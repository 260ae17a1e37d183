"""[R] #37 on the real cluster: in-job copies from a running job, `--at-end`, and `bbstage
status` over the network API (TCP on 127.0.0.1). Needs the cluster daemon's config to set
`api_address` and `munge_socket` (the cluster's munged); skipped otherwise.

Run on the real clusters since 2026-11-28."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

from tests.helpers import file_digest, wait_until

from .conftest import USER, Cluster, as_user


def _api(cluster: Cluster) -> str:
    conf = Path(cluster.env.get("BBSTAGE_CONFIG", cluster.dir / "etc" / "bbstage.toml"))
    address = tomllib.loads(conf.read_text()).get("daemon", {}).get("api_address", "")
    assert address, f"{conf}: no [daemon] api_address (scripts/local-cluster writes one)"
    return address


def test_a_job_drains_a_checkpoint_while_it_computes(cluster: Cluster, workdir: Path) -> None:
    """The job itself runs ``bbstage copy/wait`` (over the network API, as on a compute node
    without the daemon's socket). On 24.11/26.05 the job steps run chrooted in the
    generation's Debian root: there ``bbstage`` is the root's python3 running the repo's
    code (scripts/local-cluster, ``root_bbstage``), as on a compute node with its own OS."""
    api = _api(cluster)
    out = workdir / "out"
    out.mkdir()
    as_user(out)
    job = cluster.submit(
        workdir,
        f"""#!/bin/bash
#BB_LUA pool=scratch capacity=1G
export BBSTAGE_API={api}
head -c 200000000 /dev/urandom > "$BB_SCRATCH/ckpt.dat"
sha256sum "$BB_SCRATCH/ckpt.dat" | cut -d' ' -f1 > {out}/expected
id=$(bbstage copy '$BB_SCRATCH/ckpt.dat' {out}/ckpt.dat --checksum=xxh3) || exit 3
echo "$id" > {out}/id
python3 -c 'sum(i*i for i in range(3_000_000))'   # keeps computing meanwhile
bbstage wait "$id" || exit 4
head -c 1000000 /dev/urandom > "$BB_SCRATCH/late.dat"
sha256sum "$BB_SCRATCH/late.dat" | cut -d' ' -f1 > {out}/late.expected
bbstage copy --at-end '$BB_SCRATCH/late.dat' {out}/late.dat || exit 5
test ! -e {out}/late.dat || exit 6
""",
    )
    cluster.wait_gone(job, timeout=300)
    assert cluster.job(job).get("ExitCode", "0:0") == "0:0", (
        workdir / f"slurm-{job}.out"
    ).read_text()
    assert file_digest(out / "ckpt.dat") == (out / "expected").read_text().strip()
    assert file_digest(out / "late.dat") == (out / "late.expected").read_text().strip()
    status = cluster.status(job)
    kinds = sorted((r["kind"], r["state"]) for r in status["directives"])
    assert kinds == [("at_end", "done"), ("copy", "done")]


def _local_status(cluster: Cluster, job: str) -> dict:
    """The job's status over the user socket; {} while the daemon does not know the job yet
    (``bbstage status`` then prints nothing on stdout and "no staging job of yours" on
    stderr: the job is known only once slurmctld has run its setup hook)."""
    out = cluster.bbstage("status", "--json", job)
    return json.loads(out.stdout) if out.stdout else {}


def test_status_over_tcp_shows_the_job(cluster: Cluster, workdir: Path) -> None:
    api = _api(cluster)
    job = cluster.submit(workdir, "#!/bin/bash\n#BB_LUA pool=scratch capacity=1M\nsleep 5\n")
    wait_until(lambda: _local_status(cluster, job).get("state") == "running", 120, "the job to run")
    env = {**cluster.env, "BBSTAGE_API": api}
    out = subprocess.run(
        ["runuser", "-u", USER, "--", "bbstage", "status", "--json", job],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    over_tcp = json.loads(out.stdout)
    assert over_tcp["job_id"] == job
    assert over_tcp["scratch"] == _local_status(cluster, job)["scratch"]
    cluster.wait_gone(job)
