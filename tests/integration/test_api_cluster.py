# ruff: noqa: F811 - the `s3` fixture is imported from tests.s3env and used as an argument
"""[R] #37 on the real cluster: in-job copies from a running job (to POSIX and to S3),
`--at-end`, a daemon restart (SIGTERM) under an in-job copy, and `bbstage status` over the
network API: TCP on 127.0.0.1, and from a network namespace standing in for a login node.
Needs the cluster daemon's config to set `api_address` and `munge_socket` (the cluster's
munged; scripts/local-cluster writes both).

Run on the real clusters since 2026-11-28."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import signal
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.campaign import worker_pids
from tests.helpers import file_digest, process_gone, wait_until
from tests.s3env import S3Env, s3  # noqa: F401

from .conftest import REPO, USER, Cluster, as_user

pytestmark = pytest.mark.cluster


# In a Slurm root (24.11, 26.05: scripts/local-cluster) the job runs the root's bbstage
# (/usr/local/bin) before the submitter's PATH: a checkout under /tmp or /home is visible in
# the root, but its venv's Python is the host's, not the root's (CI's clone under /tmp ran
# /tmp/.../.venv/bin/bbstage there: "No module named 'bbstage'"). The host has none there.
ROOT_BBSTAGE_FIRST = "export PATH=/usr/local/bin:$PATH\n"


def _api(cluster: Cluster) -> str:
    conf = Path(cluster.env.get("BBSTAGE_CONFIG", cluster.dir / "etc" / "bbstage.toml"))
    address = tomllib.loads(conf.read_text()).get("daemon", {}).get("api_address", "")
    assert address, f"{conf}: no [daemon] api_address (scripts/local-cluster writes one)"
    return address


def _object_digest(s3: S3Env, bucket: str, key: str) -> str:
    """The sha256 of an object's bytes, read as a stream."""
    body = s3.client(USER).get_object(Bucket=bucket, Key=key)["Body"]
    digest = hashlib.sha256()
    for chunk in iter(lambda: body.read(1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


def test_a_job_drains_a_checkpoint_while_it_computes(
    cluster: Cluster, workdir: Path, s3: S3Env
) -> None:
    """The job itself runs ``bbstage copy/wait`` (over the network API, as on a compute node
    without the daemon's socket): its 200 MB checkpoint to POSIX and to S3 (RGW, with the
    user's own ~/.aws keys) while it keeps computing. On 24.11/26.05 the job steps run
    chrooted in the generation's Debian root: there ``bbstage`` is the root's python3
    running the repo's code (scripts/local-cluster, ``root_bbstage``), as on a compute node
    with its own OS."""
    api = _api(cluster)
    bucket = s3.create_bucket(owner=USER)
    out = workdir / "out"
    out.mkdir()
    as_user(out)
    job = cluster.submit(
        workdir,
        f"""#!/bin/bash
#BB_LUA pool=scratch capacity=1G
export BBSTAGE_API={api}
{ROOT_BBSTAGE_FIRST}head -c 200000000 /dev/urandom > "$BB_SCRATCH/ckpt.dat"
sha256sum "$BB_SCRATCH/ckpt.dat" | cut -d' ' -f1 > {out}/expected
id=$(bbstage copy '$BB_SCRATCH/ckpt.dat' {out}/ckpt.dat --checksum=xxh3) || exit 3
up=$(bbstage copy '$BB_SCRATCH/ckpt.dat' s3://{bucket}/ckpt/ckpt.dat) || exit 7
echo "$id $up" > {out}/id
python3 -c 'sum(i*i for i in range(3_000_000))'   # keeps computing meanwhile
bbstage wait "$id" "$up" || exit 4
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
    expected = (out / "expected").read_text().strip()
    assert file_digest(out / "ckpt.dat") == expected
    assert _object_digest(s3, bucket, "ckpt/ckpt.dat") == expected
    assert file_digest(out / "late.dat") == (out / "late.expected").read_text().strip()
    status = cluster.status(job)
    kinds = sorted((r["kind"], r["state"]) for r in status["directives"])
    assert kinds == [("at_end", "done"), ("copy", "done"), ("copy", "done")]


def _local_status(cluster: Cluster, job: str) -> dict:
    """The job's status over the user socket; {} while the daemon does not know the job yet
    (``bbstage status`` then prints nothing on stdout and "no staging job of yours" on
    stderr: the job is known only once slurmctld has run its setup hook)."""
    out = cluster.bbstage("status", "--json", job)
    return json.loads(out.stdout) if out.stdout else {}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_a_daemon_restart_under_an_in_job_copy_never_loses_it(
    cluster: Cluster, workdir: Path, sig: signal.Signals
) -> None:
    """The daemon is stopped with SIGTERM (as an upgrade or ``systemctl restart`` does) or
    SIGKILL (the OOM killer) while the job's in-job copy is writing, and started again: the
    copy ends done with every byte (resumed from the state database), or failed with its
    reason, never lost; the job's ``bbstage wait`` sees the end. Its workers are held
    (SIGSTOP) while a temporary file exists, so the signal lands mid-copy whatever the
    machine's speed, then let go (after SIGKILL they are orphans, as after a real kill).
    The job copies again (to t1/, t2/, ...) until the test has caught one under way: a
    copy can end between two looks (192 MiB in 91 ms was seen in CI); every copy is
    checked."""
    api = _api(cluster)
    out = workdir / "out"
    out.mkdir()
    as_user(out)
    job = cluster.submit(
        workdir,
        f"""#!/bin/bash
#BB_LUA pool=scratch capacity=1G
export BBSTAGE_API={api}
{ROOT_BBSTAGE_FIRST}mkdir "$BB_SCRATCH/t"
for i in $(seq -w 0 47); do head -c 4194304 /dev/urandom > "$BB_SCRATCH/t/f$i"; done
(cd "$BB_SCRATCH/t" && sha256sum f*) > {out}/expected
for n in $(seq 1 40); do
    id=$(bbstage copy '$BB_SCRATCH/t/' {out}/t$n/) || exit 3
    bbstage wait --timeout 240 "$id" > {out}/wait$n.out 2>&1
    echo $? > {out}/wait$n.rc
    [ -e {out}/caught ] && break
done
""",
    )
    uid = pwd.getpwnam(USER).pw_uid
    daemon = cluster.daemon_pid()

    def temps() -> list[Path]:
        return list(out.rglob(".*.part"))

    def copying() -> list[int]:
        if not temps():  # first: the scan of /proc takes longer
            return []
        return [p for p in worker_pids(daemon) if os.stat(f"/proc/{p}").st_uid == uid]

    frozen: list[int] = []
    for _ in range(200):  # held while a file is still being written (it may just land)
        frozen = wait_until(copying, 180, "an in-job copy under way", every=0.005)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        if temps():
            break
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    (out / "caught").touch()
    try:
        os.kill(daemon, sig)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    wait_until(lambda: process_gone(daemon), 60, f"the daemon (pid {daemon}) to stop")
    cluster.up()
    cluster.wait_gone(job, timeout=300)
    copies = [r for r in cluster.status(job)["directives"] if r["kind"] == "copy"]
    rcs = {int(p.name[4:-3]): p.read_text().strip() for p in out.glob("wait*.rc")}
    print(f"{cluster.slurm}: {len(copies)} copies, under a daemon {sig.name}:", copies)
    assert len(copies) == len(rcs) > 0, (copies, rcs)  # each ended, and the job saw it end
    for copy in copies:  # failed is allowed: reported, with a reason, to the job too
        assert copy["state"] == "done" or (copy["state"] == "failed" and copy["error"]), copy
    failed = sum(copy["state"] == "failed" for copy in copies)
    said = {n: (out / f"wait{n}.out").read_text() for n in rcs}  # what each wait printed
    assert sorted(rcs.values()) == ["0"] * (len(rcs) - failed) + ["1"] * failed, (rcs, said)
    expected = dict(line.split()[::-1] for line in (out / "expected").read_text().splitlines())
    for n, rc in rcs.items():
        if rc == "0":
            got = {p.name: file_digest(p) for p in (out / f"t{n}").iterdir()}
            assert got == expected, (n, (out / f"wait{n}.out").read_text())
    assert not temps()


@contextmanager
def login_node(api: str) -> Iterator[tuple[str, str]]:
    """A stand-in for a login node: network namespace ``login`` joined by a veth pair to
    namespace ``relay``, where scripts/netns-forward listens on 10.214.0.1 and forwards to
    the daemon's API (``api``, on the host's 127.0.0.1). Both namespaces are this test's own;
    ``login`` reaches nothing else (its loopback is its own, it has no default route). The
    file system is shared, so munge's socket (a path) works there as on the host, as a
    login node runs its own munged with the site's key. Yields (login namespace, the API's
    address as the login node sees it)."""
    tag = uuid.uuid4().hex[:6]
    login, relay = f"bbt-login-{tag}", f"bbt-relay-{tag}"
    port = api.rpartition(":")[2]
    forward = None

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    try:
        ip("netns", "add", login)
        ip("netns", "add", relay)
        ip("link", "add", f"bbl{tag}", "netns", login, "type", "veth",
           "peer", "name", f"bbr{tag}", "netns", relay)  # fmt: skip
        for ns, dev, addr in ((login, f"bbl{tag}", "10.214.0.2/24"),
                              (relay, f"bbr{tag}", "10.214.0.1/24")):  # fmt: skip
            ip("-n", ns, "addr", "add", addr, "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        forward = subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / "netns-forward"), "--netns", relay,
             f"10.214.0.1:{port}", api],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        yield login, f"10.214.0.1:{port}"
    finally:
        if forward is not None:
            forward.kill()
            forward.wait(10)
        for ns in (login, relay):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_status_over_tcp_and_from_a_login_node_shows_the_job(
    cluster: Cluster, workdir: Path
) -> None:
    api = _api(cluster)
    job = cluster.submit(workdir, "#!/bin/bash\n#BB_LUA pool=scratch capacity=1M\nsleep 60\n")
    wait_until(lambda: _local_status(cluster, job).get("state") == "running", 120, "the job to run")
    local = _local_status(cluster, job)

    def status(*netns: str, address: str = api) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*netns, "runuser", "-u", USER, "--", "bbstage", "status", "--json", job],
            env={**cluster.env, "BBSTAGE_API": address}, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip

    over_tcp = status()
    assert over_tcp.returncode == 0, over_tcp.stderr
    assert json.loads(over_tcp.stdout)["job_id"] == job
    assert json.loads(over_tcp.stdout)["scratch"] == local["scratch"]
    with login_node(api) as (login, address):
        netns = ("ip", "netns", "exec", login)
        # The host's 127.0.0.1 is not the login node's: only the relay leads to the daemon.
        unreachable = status(*netns)
        assert unreachable.returncode == 4, unreachable
        remote = wait_until(
            lambda: (r := status(*netns, address=address)).returncode == 0 and r, 30,
            "bbstage status from the login namespace",
        )  # fmt: skip
        seen = json.loads(remote.stdout)
        assert seen["job_id"] == job and seen["scratch"] == local["scratch"]
        assert seen["state"] == "running"
    cluster.run("scancel", job)  # seen running: no need to sleep on
    cluster.wait_gone(job)
