"""Staging through the Dask executor on the namespaced testbed (scripts/local-movers): a
scheduler and two rate-capped workers, each in a network namespace of its own, mutual TLS.

The module runs once per Slurm generation: it switches that shared cluster's daemon to
``executor = "dask"`` (``up --movers 2``) and back to the local engine when it ends.
Run it under the cluster lock:
``flock -w 1800 /tmp/bbstage-cluster.lock .venv/bin/pytest tests/integration/test_dask_cluster.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import file_digest, make_tree, process_gone, tree_digests, wait_until
from tests.s3env import S3Env, s3  # noqa: F401

from .conftest import REPO, SLURM_VERSIONS, USER, Cluster, as_user, local_cluster_up

pytestmark = pytest.mark.cluster
distributed = pytest.importorskip("distributed")

WORKERS = 2
DTNS = {f"dtn{i}" for i in range(1, WORKERS + 1)}


@pytest.fixture(scope="module", params=SLURM_VERSIONS)
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A cluster of each Slurm generation with its daemon on the Dask engine (the same
    testbed serves both); the local engine again after."""
    version = request.param
    try:
        env = local_cluster_up("--slurm", version, "--movers", str(WORKERS), timeout=900)
        movers = subprocess.run(
            [str(REPO / "scripts" / "local-movers"), "env"],
            capture_output=True,
            text=True,
            check=True,
        )
        env.update(re.findall(r"export (\w+)=(\S+)", movers.stdout))
        conf = Path(env["BBSTAGE_CONFIG"]).read_text()
        assert 'executor = "dask"' in conf, conf
        yield Cluster(env, Path(env["BBSTAGE_CLUSTER_DIR"]), version)
    finally:
        # the cluster is shared: back to the local engine
        local_cluster_up("--slurm", version, timeout=900)


def ended(cluster: Cluster, job: str) -> list[dict[str, str]]:
    """The daemon's "transfer ended" records (JSON lines) of the job's Dask attempts."""
    found = []
    for line in (cluster.dir / "log" / "bbstage.log").read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        attempt = record.get("attempt", "")
        if record.get("event") == "transfer ended" and attempt.startswith(f"{job}:"):
            found.append(record)
    return found


def bbstage_events(cluster: Cluster, job: str) -> list[str]:
    """The job's ``distributed.Event`` names left on the scheduler (asked with the
    daemon's certificate)."""
    from distributed import Client
    from distributed.security import Security

    tls = Path(cluster.env["BBSTAGE_MOVERS_TLS"])
    security = Security(
        tls_ca_file=str(tls / "ca.pem"),
        tls_client_cert=str(tls / "client.pem"),
        tls_client_key=str(tls / "client.key"),
        require_encryption=True,
    )
    with Client(cluster.env["BBSTAGE_MOVERS_SCHEDULER"], security=security, timeout=30) as c:
        names = c.run_on_scheduler(
            lambda dask_scheduler: [str(n) for n in dask_scheduler.extensions["events"]._events]
        )
    return [n for n in names if n.startswith("bbstage-") and f"-{job}:" in n]


def attempts_accounted(cluster: Cluster, job: str) -> list[dict[str, Any]]:
    """Check the job's attempts as the daemon recorded them (``bbstage status --json``):
    none left running, the done ones' files and bytes sum to each directive's, every done
    one ran on a transfer node; no Dask event of the job left on the scheduler."""
    directives = cluster.status(job)["directives"]
    for d in directives:
        done = [a for a in d["attempts"] if a["state"] == "done"]
        assert done, d
        assert not [a for a in d["attempts"] if a["state"] == "running"], d["attempts"]
        assert sum(a["files"] for a in done) == d["files_total"], d
        assert sum(a["bytes"] for a in done) == d["bytes_total"], d
        assert {a["node"] for a in done} <= DTNS, d["attempts"]
        assert not any(n["running"] for n in d["nodes"]), d["nodes"]
    assert not bbstage_events(cluster, job)
    return directives


def copies(uid: int) -> list[int]:
    """Processes of ``uid`` running a remote copy (``python -m bbstage.transfer.dask_task``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if (
                os.stat(f"/proc/{pid}").st_uid == uid
                and b"bbstage.transfer.dask_task" in Path(f"/proc/{pid}/cmdline").read_bytes()
            ):
                found.append(int(pid))
        except OSError:
            pass
    return found


def net_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def staged_in_and_out(cluster: Cluster, workdir: Path, source: str, inside: str, back: str) -> str:
    """Run a job that stages ``source`` to ``inside`` and ``inside`` back to ``back`` (all
    trees) and counts its files into count.txt; the job id. Both directives must have run
    as Dask tasks on the transfer nodes, not in local workers, each split into one shard
    per node; the job's shards ran on every node. (Not each directive's: when one shard
    ends before the next is placed, Dask may run both on one node, as it did once on the
    24.11 run.)"""
    as_user(workdir)
    job = cluster.submit(
        workdir,
        "#!/bin/bash\n"
        f"#BB_LUA stage_in source={source} destination={inside}\n"
        f"#BB_LUA stage_out source={inside} destination={back}\n"
        f"find {inside} -type f | wc -l > count.txt\n",
    )
    cluster.wait_gone(job, timeout=240)
    assert cluster.job(job)["JobState"] == "COMPLETED", cluster.status(job)
    nodes: dict[str, set[str]] = {}
    for e in ended(cluster, job):
        nodes.setdefault(e["attempt"].split(".")[0], set()).add(e["node"])
    assert set(nodes) == {f"{job}:0", f"{job}:1"}, nodes
    assert set().union(*nodes.values()) == DTNS, nodes
    return job


def test_a_tree_is_staged_in_and_out_through_dask_as_the_user(
    cluster: Cluster, workdir: Path
) -> None:
    src = make_tree(workdir / "src", 40, 256 << 10, sub="deeper")
    inside, back = workdir / "in", workdir / "back"
    job = staged_in_and_out(cluster, workdir, f"{src}/", f"{inside}/", f"{back}/")
    want = tree_digests(src)
    assert tree_digests(inside) == want
    assert tree_digests(back) == want
    uid = int(cluster.run("id", "-u", USER).strip())
    for path in [*inside.rglob("*"), *back.rglob("*")]:
        assert path.lstat().st_uid == uid, path
    # The daemon recorded every attempt (before submitting it) with its node: each
    # directive's shards, one per node, and `bbstage status` shows them.
    logged = {e["attempt"] for e in ended(cluster, job)}
    for d in attempts_accounted(cluster, job):
        done = [a for a in d["attempts"] if a["state"] == "done"]
        assert sorted(a["shard"] for a in done) == list(range(WORKERS))
        assert d["files_total"] == 40 and {a["id"] for a in done} <= logged
    assert "nodes: dtn1 " in cluster.bbstage("status", job).stdout


def test_s3_is_staged_in_and_out_through_the_nodes(
    cluster: Cluster,
    workdir: Path,
    s3: S3Env,  # noqa: F811
) -> None:
    """The user's own ~/.aws files name the endpoint (127.0.0.1 of every node here,
    forwarded through each node's capped link to radosgw)."""
    bucket = s3.create_bucket(owner=USER)
    client = s3.client(USER)
    want = {}
    for i in range(24):
        body = os.urandom(300_000 + i)
        client.put_object(Bucket=bucket, Key=f"in/d{i % 3}/o{i}", Body=body)
        want[f"d{i % 3}/o{i}"] = body
    inside = workdir / "in"
    staged_in_and_out(cluster, workdir, f"s3://{bucket}/in/", f"{inside}/", f"s3://{bucket}/out/")
    assert (workdir / "count.txt").read_text().split() == [str(len(want))]
    for name, body in want.items():
        assert (inside / name).read_bytes() == body, name
        got = client.get_object(Bucket=bucket, Key=f"out/{name}")["Body"].read()
        assert got == body, name


def movers(*args: str) -> str:
    proc = subprocess.run(
        [str(REPO / "scripts" / "local-movers"), *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"local-movers {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def kill_group(pidfile: Path) -> None:
    """SIGKILL the process group a pid file of local-movers names (setsid: the process,
    its nanny's worker, ...); the copies' own sessions survive it, as on a node that died
    they would not: they notice and end."""
    os.killpg(int(pidfile.read_text().split()[0]), signal.SIGKILL)


def parts(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".bbstage-" in p.name]


def staged_through_a_fault(cluster: Cluster, workdir: Path, fault: Any) -> list[dict[str, Any]]:
    """Stage a tree in; once a copy is under way, ``fault()``; the job must still run on
    the whole tree, byte for byte, with no temporary file left behind. The files are
    sparse, 512 MiB each: the copies share the file system (the rate cap is on the
    network), and a copy must last long enough for the fault to find it mid-file."""
    src = workdir / "src"
    src.mkdir()
    for i in range(8):
        with open(src / f"f{i}", "wb") as f:
            f.write(os.urandom(4096))
            f.truncate(512 << 20)
    as_user(workdir)
    dst = workdir / "dst"
    job = cluster.submit(
        workdir,
        f"#!/bin/bash\n#BB_LUA stage_in source={src}/ destination={dst}/\n"
        f"ls {dst} | wc -l > count.txt\n",
    )
    wait_until(lambda: dst.exists() and parts(dst), 120, "a copy under way")
    fault()
    cluster.wait_gone(job, timeout=400)
    assert cluster.job(job)["JobState"] == "COMPLETED", cluster.status(job)
    assert (workdir / "count.txt").read_text().split() == ["8"]
    assert not parts(dst), parts(dst)
    assert tree_digests(dst) == tree_digests(src)
    return attempts_accounted(cluster, job)


def node_dies(cluster: Cluster) -> None:
    """Worker 1 and its copies SIGKILLed at once, as when a node loses power: no process
    is left to remove the copy's temporary files (a copy whose worker alone dies removes
    its own: its pipe breaks)."""
    run = Path(cluster.env["BBSTAGE_MOVERS_DIR"]) / "run"
    uid = int(cluster.run("id", "-u", USER).strip())
    worker = int((run / "worker-1.pid").read_text().split()[0])
    on_node = [p for p in copies(uid) if net_namespace(p) == net_namespace(worker)]
    assert on_node, "no copy under way on worker 1"
    kill_group(run / "worker-1.pid")
    for pid in on_node:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.newest_only  # no Slurm behaviour in it (CI time)
def test_a_node_that_dies_mid_transfer_leaves_a_complete_verified_job(
    cluster: Cluster, workdir: Path
) -> None:
    """Dask reruns the dead node's shard on worker 2, which sweeps its temporary files."""
    try:
        staged_through_a_fault(cluster, workdir, lambda: node_dies(cluster))
    finally:
        movers("up", str(WORKERS))  # the node comes back


def sparse_file(path: Path, size: int) -> None:
    """``size`` bytes, random at the start, the middle and the end, holes between (the
    nodes share the file system: holes keep a big source cheap to make)."""
    with open(path, "wb") as f:
        for offset in (0, size // 2 - 2048, size - 4096):
            f.seek(offset)
            f.write(os.urandom(4096))


@pytest.mark.newest_only  # no Slurm behaviour in it (CI time)
def test_a_big_file_is_split_across_the_nodes_in_byte_ranges(
    cluster: Cluster, workdir: Path
) -> None:
    """A file of at least ``[movers] range_min`` (1 GiB) to a POSIX destination: each node
    writes its share of the bytes into one temporary file, the last puts it in place."""
    src = workdir / "big.dat"
    sparse_file(src, (1 << 30) + 4097)
    inside, back = workdir / "in" / "big.dat", workdir / "back.dat"
    inside.parent.mkdir()
    job = staged_in_and_out(cluster, workdir, str(src), str(inside), str(back))
    want = file_digest(src)
    assert file_digest(inside) == want and file_digest(back) == want
    assert (workdir / "count.txt").read_text().split() == ["1"]
    for d in attempts_accounted(cluster, job):
        done = [a for a in d["attempts"] if a["state"] == "done"]
        assert sorted(a["shard"] for a in done) == list(range(WORKERS)), done
        assert (d["files_total"], d["bytes_total"]) == (1, (1 << 30) + 4097), d
    assert not parts(workdir), parts(workdir)


@pytest.mark.newest_only  # no Slurm behaviour in it (CI time)
def test_a_big_file_is_uploaded_to_s3_in_pieces_by_the_nodes(
    cluster: Cluster,
    workdir: Path,
    s3: S3Env,  # noqa: F811
) -> None:
    """Each node uploads its share of the file as a piece beside the object, through its
    capped link; the last assembles the object on the server. No piece, no upload left."""
    bucket = s3.create_bucket(owner=USER)
    src = workdir / "big.dat"
    sparse_file(src, (1 << 30) + 4097)
    as_user(workdir)
    job = cluster.submit(
        workdir,
        f"#!/bin/bash\n#BB_LUA stage_out source={src} destination=s3://{bucket}/out/big.dat\n"
        "true\n",
    )
    cluster.wait_gone(job, timeout=400)
    assert cluster.job(job)["JobState"] == "COMPLETED", cluster.status(job)
    (d,) = attempts_accounted(cluster, job)
    done = [a for a in d["attempts"] if a["state"] == "done"]
    assert {a["node"] for a in done} == DTNS and sorted(a["shard"] for a in done) == [0, 1]
    client = s3.client(USER)
    assert [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]] == ["out/big.dat"]
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    digest = hashlib.sha256()
    for chunk in client.get_object(Bucket=bucket, Key="out/big.dat")["Body"].iter_chunks(8 << 20):
        digest.update(chunk)
    assert digest.hexdigest() == file_digest(src)


@pytest.mark.newest_only  # no Slurm behaviour in it (CI time)
def test_a_node_that_dies_mid_range_leaves_a_complete_verified_file(
    cluster: Cluster, workdir: Path
) -> None:
    """Dask reruns the dead node's range on worker 2: it writes the range again into the
    same temporary file (never truncated), and the file is put in place whole."""
    src = workdir / "big.dat"
    sparse_file(src, 4 << 30)
    dst = workdir / "in" / "big.dat"
    dst.parent.mkdir()
    as_user(workdir)
    job = cluster.submit(
        workdir, f"#!/bin/bash\n#BB_LUA stage_in source={src} destination={dst}\ntrue\n"
    )
    try:
        wait_until(lambda: parts(dst.parent), 120, "the ranges under way")
        node_dies(cluster)
        cluster.wait_gone(job, timeout=400)
    finally:
        movers("up", str(WORKERS))  # the node comes back
    assert cluster.job(job)["JobState"] == "COMPLETED", cluster.status(job)
    assert file_digest(dst) == file_digest(src)
    assert not parts(dst.parent), parts(dst.parent)
    attempts_accounted(cluster, job)


@pytest.mark.newest_only  # no Slurm behaviour in it (CI time)
def test_a_scheduler_restart_mid_transfer_leaves_a_complete_verified_job(
    cluster: Cluster, workdir: Path
) -> None:
    run = Path(cluster.env["BBSTAGE_MOVERS_DIR"]) / "run"

    def restart() -> None:
        kill_group(run / "scheduler.pid")
        time.sleep(2)
        movers("up", str(WORKERS))

    try:
        (d,) = staged_through_a_fault(cluster, workdir, restart)
        lost = [a for a in d["attempts"] if a["state"] == "failed"]
        assert any("Dask task lost" in a["error"] for a in lost), d["attempts"]
    finally:
        movers("up", str(WORKERS))


# A scheduler address that answers each connection with bytes that are no TLS: as when a
# scheduler being killed still accepts connections, some of the daemon's reconnections end
# in tornado's "IOStream is not idle; cannot convert to SSL", which distributed does not
# expect (CI's job 453 hung on it for 400 s, and every job after it).
GARBLED_SCHEDULER = """
import socket, sys, time
host, port = sys.argv[1:]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
for _ in range(100):  # until the killed scheduler's socket is gone
    try:
        s.bind((host, int(port)))
        break
    except OSError:
        time.sleep(0.1)
s.listen(128)
while True:
    c, _ = s.accept()
    c.sendall(b"x" * 100)
    c.close()
"""


@pytest.mark.newest_only  # no Slurm behaviour in it (CI time)
def test_a_client_whose_reconnection_dies_is_given_up_and_the_job_completes(
    cluster: Cluster, workdir: Path
) -> None:
    """The scheduler is killed mid-transfer and a garbled one answers at its address until
    the daemon's Dask client has died reconnecting (its log shows that traceback); then a
    new scheduler. The client stays "connecting" for ever: the next attempt waits, the
    executor gives the client up after ``GIVE_UP`` s, and the attempt, through a new client,
    stages the whole tree."""
    run = Path(cluster.env["BBSTAGE_MOVERS_DIR"]) / "run"
    host, port = cluster.env["BBSTAGE_MOVERS_SCHEDULER"].removeprefix("tls://").rsplit(":", 1)
    log = cluster.dir / "log" / "bbstage.log"
    # distributed logs the traceback of a reconnection that died (other calls may meet the
    # garbled scheduler too, e.g. the deletion of a lost attempt's events, and recover).
    died = ", in _reconnect\n"
    before = log.read_text(errors="replace").count(died)

    def garbled_then_restarted() -> None:
        kill_group(run / "scheduler.pid")
        python = str(REPO / ".venv" / "bin" / "python")
        garbled = subprocess.Popen(
            ["ip", "netns", "exec", "bbm-sched", python, "-c", GARBLED_SCHEDULER, host, port]
        )
        try:
            wait_until(
                lambda: log.read_text(errors="replace").count(died) > before,
                60,
                "the daemon's client to die reconnecting",
                every=0.2,  # the whole log each time
            )
        finally:
            garbled.kill()
            garbled.wait()
        movers("up", str(WORKERS))

    try:
        (d,) = staged_through_a_fault(cluster, workdir, garbled_then_restarted)
    finally:
        movers("up", str(WORKERS))
    lost = [a for a in d["attempts"] if a["state"] == "failed"]
    assert any("Dask task lost" in a["error"] for a in lost), d["attempts"]
    after = log.read_text(errors="replace").split(died, before + 1)[-1]
    assert "client given up" in after


def test_a_daemon_killed_mid_transfer_leaves_a_complete_verified_job(
    cluster: Cluster, workdir: Path
) -> None:
    """SIGKILL of the daemon while the nodes copy: the scheduler releases its tasks, whose
    copies stop (else they would race the next attempts); the restarted daemon records
    them lost, resumes with new attempts, and deletes the events the old ones left on the
    scheduler (``attempts_accounted``: none of the job's is left)."""
    uid = int(cluster.run("id", "-u", USER).strip())

    def daemon_dies() -> None:
        orphans = set(copies(uid))
        assert orphans, "no copy under way"
        pid = cluster.daemon_pid()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: process_gone(pid), 20, f"the killed daemon (pid {pid}) to end")
        wait_until(lambda: not orphans & set(copies(uid)), 10, "the orphaned copies to stop")
        subprocess.run(
            [str(REPO / "scripts" / "local-cluster"), "restart-daemon", "--slurm", cluster.slurm],
            check=True, stdout=subprocess.DEVNULL, timeout=300,
        )  # fmt: skip

    (d,) = staged_through_a_fault(cluster, workdir, daemon_dies)
    assert any(a["state"] == "lost" for a in d["attempts"]), d["attempts"]


@pytest.mark.newest_only  # no Slurm behaviour in it (CI time)
def test_bench_with_the_dask_engine_measures_the_nodes(cluster: Cluster, workdir: Path) -> None:
    """``bbstage bench --executor dask`` (root, the daemon's [movers] configuration): the
    data set is the user's, every node copies a shard of it, cp -r runs here for reference."""
    for side in ("s", "d"):
        (workdir / side).mkdir()
    as_user(workdir)
    proc = cluster.bbstage(
        "bench", "--executor", "dask", "--as-user", USER,
        "--source", str(workdir / "s"), "--destination", str(workdir / "d"),
        "--files", "60", "--file-size", "256K", "--json", "--quiet",
        user=None,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out["engine"]["nodes"]) == DTNS, out["engine"]
    assert (out["files"], out["total_bytes"]) == (60, 60 * (256 << 10))
    assert out["mb_per_s"] > 0 and "cp" in out["baselines"]
    print(f"bench --executor dask: {out['mb_per_s']:.1f} MB/s on {sorted(DTNS)};"
          f" cp -r here {out['baselines']['cp']['mb_per_s']:.1f} MB/s")  # fmt: skip


@pytest.mark.newest_only  # no Slurm behaviour in it (CI time)
def test_bench_with_the_dask_engine_measures_s3_downloads_through_the_nodes(
    cluster: Cluster,
    workdir: Path,
    s3: S3Env,  # noqa: F811
) -> None:
    """The user uploads the data set with their own credentials (untimed); the nodes
    download it as the user, through their capped links."""
    bucket = s3.create_bucket(owner=USER)
    (workdir / "d").mkdir()
    as_user(workdir)
    proc = cluster.bbstage(
        "bench", "--executor", "dask", "--as-user", USER, "--source", f"s3://{bucket}/b",
        "--destination", str(workdir / "d"), "--files", "40", "--file-size", "1M", "--json",
        "--quiet",
        user=None,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out["engine"]["nodes"]) == DTNS, out["engine"]
    assert (out["files"], out["total_bytes"], out["mover"]) == (40, 40 << 20, "s3:S3Download")
    assert s3.client(USER).list_objects_v2(Bucket=bucket).get("Contents", []) == []  # cleaned


def scancel_stops_the_remote_copy_within_2s(
    cluster: Cluster, workdir: Path, before_scancel: Callable[[], object] = lambda: None
) -> None:
    """Stage a sparse 16 GiB file through Dask, ``scancel`` the job mid-copy (right after
    ``before_scancel()``): the remote copy ends within 2 s."""
    big = workdir / "big"
    with open(big, "wb") as f:
        f.truncate(16 << 30)  # sparse: its copy takes many seconds
    as_user(workdir)
    uid = int(cluster.run("id", "-u", USER).strip())
    job = cluster.submit(
        workdir, f"#!/bin/bash\n#BB_LUA stage_in source={big} destination={workdir}/out\ntrue\n"
    )
    pids = wait_until(lambda: copies(uid), 60, "the remote copy to start")
    # It runs in a worker's network namespace, not the daemon's.
    assert net_namespace(pids[0]) != net_namespace(os.getpid())
    wait_until(
        lambda: [p for p in workdir.iterdir() if p.name.endswith(".part")], 30, "a temp file"
    )
    before_scancel()
    started = time.monotonic()
    cluster.run("scancel", job)
    wait_until(lambda: not copies(uid), 10, "the remote copy to stop")
    stopped = time.monotonic() - started
    print(f"remote copy stopped {stopped:.2f} s after scancel")
    assert stopped < 2.0, f"the remote copy ran on for {stopped:.2f} s after scancel"


def no_temporary_files(workdir: Path) -> None:
    wait_until(
        lambda: not [p for p in workdir.iterdir() if ".bbstage-" in p.name],
        5,
        lambda: f"no temp files, found {sorted(p.name for p in workdir.iterdir())}",
    )


def slurmscriptd(cluster: Cluster) -> int:
    """The pid of the cluster's slurmscriptd (slurmctld's child of that name)."""
    ctld = (cluster.dir / "run" / "slurmctld.pid").read_text().strip()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        if name == "slurmscriptd" and parent == ctld:
            found.append(int(pid))
    (scriptd,) = found
    return scriptd


def test_scancel_stops_the_remote_copy_within_2s(cluster: Cluster, workdir: Path) -> None:
    scancel_stops_the_remote_copy_within_2s(cluster, workdir)
    no_temporary_files(workdir)


def test_scancel_stops_the_remote_copy_within_2s_when_slurm_loses_the_teardown(
    cluster: Cluster, workdir: Path
) -> None:
    # Slurm may kill the teardown it starts for a job cancelled in stage-in (see bbstage/
    # reconcile.py). Made certain here: slurmscriptd, which runs every hook, is stopped from
    # just before the scancel until the copy has ended. What stops the copy then is the
    # daemon's own look at the jobs being staged in (the cluster's reconcile_interval is the
    # default 10 s: that whole pass would be too late).
    scriptd = slurmscriptd(cluster)
    try:
        scancel_stops_the_remote_copy_within_2s(
            cluster, workdir, lambda: os.kill(scriptd, signal.SIGSTOP)
        )
        no_temporary_files(workdir)
    finally:
        os.kill(scriptd, signal.SIGCONT)


def tls_first_bytes(host: str, port: int, ca: str, certs: Path | None = None) -> bytes:
    """Connect with TLS (with the daemon's certificate from ``certs``, or none) and read
    the scheduler's first bytes."""
    context = ssl.create_default_context(cafile=ca)
    context.check_hostname = False
    if certs is not None:
        context.load_cert_chain(certs / "client.pem", certs / "client.key")
    with socket.create_connection((host, port), timeout=5) as raw:
        with context.wrap_socket(raw) as conn:
            conn.settimeout(5)
            return conn.recv(16)


@pytest.mark.newest_only  # no Slurm behaviour in it (CI time)
def test_a_client_without_a_certificate_of_the_ca_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    tls = Path(cluster.env["BBSTAGE_MOVERS_TLS"])
    scheduler = cluster.env["BBSTAGE_MOVERS_SCHEDULER"]
    # A certificate and key of a CA the cluster does not know.
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=stranger", "-keyout", str(tmp_path / "k.pem"),
         "-out", str(tmp_path / "c.pem")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    probe = (
        "import sys\n"
        "from distributed import Client\n"
        "from distributed.security import Security\n"
        "address, ca, cert, key = sys.argv[1:]\n"
        "kw = dict(tls_ca_file=ca, tls_client_cert=cert or None, tls_client_key=key or None)\n"
        "sec = Security(**kw) if ca else None\n"
        "try:\n"
        "    with Client(address, security=sec, timeout=5) as c:\n"
        "        print('workers', len(c.scheduler_info()['workers']))\n"
        "except Exception as exc:\n"
        "    print('refused', type(exc).__name__, exc); sys.exit(3)\n"
    )
    python = str(REPO / ".venv" / "bin" / "python")

    def connect(address: str, ca: str, cert: str = "", key: str = "") -> str:
        proc = subprocess.run(
            [python, "-c", probe, address, ca, cert, key],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return f"{proc.returncode} {proc.stdout}"

    ca = str(tls / "ca.pem")
    good = connect(scheduler, ca, str(tls / "client.pem"), str(tls / "client.key"))
    assert good.startswith(f"0 workers {WORKERS}"), good  # the control: the daemon's own
    # No certificate: distributed will not even try, so speak TLS to it directly.
    host, port = scheduler.removeprefix("tls://").rsplit(":", 1)
    assert tls_first_bytes(host, int(port), ca, tls).startswith(b":")  # the control again
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"):
        tls_first_bytes(host, int(port), ca)
    stranger = connect(scheduler, ca, str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
    assert stranger.startswith("3 refused"), "a certificate of another CA"
    plain = connect(scheduler.replace("tls://", "tcp://"), "")
    assert plain.startswith("3 refused"), "no TLS at all"
