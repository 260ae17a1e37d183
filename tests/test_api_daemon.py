"""[R] #37: the munge-authenticated network API and in-job copies, against a real daemon and
a real munged (its own key and socket), with the real Lua hooks run outside Slurm.

The daemon runs with ``job_check = "state"``: "is job J running and owned by U" is answered
from its own record (set up by the hooks for U, pre_run seen), not by squeue (no Slurm here);
tests/integration/test_api_cluster.py asks Slurm."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bbstage import client, munge, protocol

from .campaign import worker_pids
from .helpers import file_digest, free_port, wait_until
from .hookharness import REPO, Daemon, area, script, start_daemon, user_ids, user_tree
from .mungeharness import Munged, remove, start_munged

__all__ = ["area"]


@pytest.fixture
def munged(area: Path) -> Iterator[Munged]:
    m = start_munged(area)
    yield m
    remove(m)


@pytest.fixture
def api(area: Path, munged: Munged) -> Iterator[tuple[Daemon, int]]:
    port = free_port()
    extra = (f'metrics_address = ""\napi_address = "127.0.0.1:{port}"\n'
             f'munge_socket = "{munged.socket}"\njob_check = "state"')  # fmt: skip
    d = start_daemon(area / "d", extra=extra)
    yield d, port
    if d.proc.poll() is None:
        d.stop()


def send(port: int, line: bytes) -> dict:
    """One API exchange: ``line`` (a credential) and a newline; the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        return json.loads(client.exchange(sock, line))


def cli(
    d: Daemon, *args: str, user: str | None = "bbuser1", **env: str
) -> subprocess.CompletedProcess[str]:
    argv = ["runuser", "-u", user, "--"] if user else []
    return subprocess.run(
        [*argv, sys.executable, "-m", "bbstage.cli.main", "--config", str(d.config), *args],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )  # fmt: skip


def running_job(d: Daemon, area: Path, job_id: str, *lines: str) -> Path:
    """Job ``job_id`` of bbuser1 set up, staged in and started; its scratch."""
    uid, gid = user_ids()
    job = script(area / f"job{job_id}.sh", *lines)
    assert d.hook("slurm_bb_setup", job_id, str(uid), str(gid), "(null)", "0", job) == (0, "")
    assert d.hook("slurm_bb_data_in", job_id, job) == (0, "")
    assert d.hook("slurm_bb_pre_run", job_id, job)[0] == 0
    return d.root / "scratch" / job_id


# -- authentication ---------------------------------------------------------------------------


def test_a_request_with_a_good_credential_is_answered_as_its_uid(
    api: tuple[Daemon, int], munged: Munged
) -> None:
    _, port = api
    cred = munge.encode(protocol.api_payload("ping"), munged.socket)
    assert send(port, cred) == {"status": "ok", "result": {"uid": 0}}
    out = cli(api[0], "status", "1", BBSTAGE_API=f"127.0.0.1:{port}")
    assert "no staging job of yours" in out.stderr  # as bbuser1, through the API


def test_no_credential_garbage_and_a_plain_request_are_refused(api: tuple[Daemon, int]) -> None:
    _, port = api
    for line in (b"", b"MUNGE:garbage:", protocol.encode_request("ping")):
        reply = send(port, line)
        assert reply["status"] == "error" and "not authenticated" in reply["message"], line


def test_a_credential_of_another_key_is_refused(api: tuple[Daemon, int], area: Path) -> None:
    other = start_munged(area)
    try:
        cred = munge.encode(protocol.api_payload("ping"), other.socket)
    finally:
        remove(other)
    reply = send(api[1], cred)
    assert reply["status"] == "error" and "not authenticated" in reply["message"]
    assert "Invalid credential" in reply["message"] or "credential" in reply["message"].lower()


def test_an_expired_credential_is_refused(api: tuple[Daemon, int], munged: Munged) -> None:
    cred = munge.encode(protocol.api_payload("ping"), munged.socket, ttl=1)
    time.sleep(2.2)
    reply = send(api[1], cred)
    assert reply == {"status": "error", "message": "not authenticated: munge: Expired credential"}


def test_a_replayed_credential_is_refused(api: tuple[Daemon, int], munged: Munged) -> None:
    cred = munge.encode(protocol.api_payload("ping"), munged.socket)
    assert send(api[1], cred)["status"] == "ok"
    reply = send(api[1], cred)
    assert reply == {"status": "error", "message": "not authenticated: munge: Replayed credential"}


def test_a_replay_is_refused_after_munged_restarts_and_forgets(
    api: tuple[Daemon, int], munged: Munged
) -> None:
    """munged keeps the credentials it decoded in memory only: our own cache refuses."""
    cred = munge.encode(protocol.api_payload("ping"), munged.socket)
    assert send(api[1], cred)["status"] == "ok"
    munged.stop()
    munged.start()
    assert munge.decode(munge.encode(b"x", munged.socket), munged.socket).payload == b"x"
    reply = send(api[1], cred)
    assert reply == {"status": "error", "message": "not authenticated: munge: Replayed credential"}


def test_a_payload_not_made_for_the_api_is_refused(api: tuple[Daemon, int], munged: Munged) -> None:
    cred = munge.encode(protocol.encode_request("ping"), munged.socket)  # no API prefix
    reply = send(api[1], cred)
    assert reply["status"] == "error" and "not a bbstage API request" in reply["message"]


# -- the same answers, two transports ---------------------------------------------------------


def test_status_jobs_pools_over_the_api_match_the_local_socket(
    api: tuple[Daemon, int], area: Path
) -> None:
    d, port = api
    running_job(d, area, "401")
    for args in (["status", "401"], ["jobs"], ["pools"], ["status", "--json", "401"]):
        local = cli(d, *args)
        remote = cli(d, *args, BBSTAGE_API=f"127.0.0.1:{port}")
        assert local.returncode == remote.returncode == 0, (local.stderr, remote.stderr)
        if args[-1] == "401" and "--json" in args:
            a, b = json.loads(local.stdout), json.loads(remote.stdout)
            a.pop("updated"), b.pop("updated")
            assert a == b
        else:
            assert local.stdout == remote.stdout
    other = cli(d, "status", "401", user="bbuser2", BBSTAGE_API=f"127.0.0.1:{port}")
    assert other.returncode == 3 and "no staging job of yours" in other.stderr


FLOOD = """
import atexit, selectors, signal, socket, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
atexit.register(lambda: print(made, flush=True))
port, held, until = int(sys.argv[1]), int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
sel, made = selectors.DefaultSelector(), 0
def connect():
    global made
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    sel.register(s, selectors.EVENT_READ)
    made += 1
for _ in range(held):
    connect()
while time.monotonic() < until:  # held open, never a byte sent; closed: open another
    for key, _ in sel.select(0.05):
        sel.unregister(key.fileobj)
        key.fileobj.close()
        connect()
"""


@pytest.mark.parametrize("held", [40, 1000])
def test_idle_connections_of_one_user_do_not_shut_another_out(
    api: tuple[Daemon, int], area: Path, held: int
) -> None:
    """A hostile user on a login node (one address for all its users) holds idle TCP
    connections to the API (40: under the bound of those waiting for their line; 1000: past
    it, so that they put each other out) and opens another as each is closed, never sending
    a credential; another user's requests from that address are all answered, none "busy"."""
    d, port = api
    running_job(d, area, "405")
    flood = subprocess.Popen(
        ["runuser", "-u", "bbuser2", "--", sys.executable, "-c", FLOOD, str(port), str(held), "30"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(1)  # the flood holds its connections
        answers = [cli(d, "status", "405", BBSTAGE_API=f"127.0.0.1:{port}") for _ in range(15)]
    finally:
        flood.terminate()
        made = flood.communicate(timeout=30)[0]
    busy = [a.stderr for a in answers if a.returncode != 0]
    assert not busy, f"{len(busy)} of 15 not answered: {busy[0]}"
    assert all("job 405:" in a.stdout for a in answers)
    assert int(made) >= held  # the flood ran (its connections: as many as it could open)


# -- in-job copies ----------------------------------------------------------------------------


def test_an_in_job_copy_and_an_at_end_copy_land_with_their_bytes(
    api: tuple[Daemon, int], area: Path
) -> None:
    d, port = api
    uid, gid = user_ids()
    (area / "out").mkdir()
    out = user_tree(area / "out", uid, gid)
    scratch = running_job(d, area, "402")
    ckpt = scratch / "ckpt.dat"
    ckpt.write_bytes(os.urandom(24 << 20))
    final = scratch / "final.dat"
    final.write_bytes(os.urandom(3 << 20))
    user_tree(scratch, uid, gid)
    env = {"BBSTAGE_API": f"127.0.0.1:{port}", "SLURM_JOB_ID": "402"}
    copied = cli(d, "copy", "$BB_SCRATCH/ckpt.dat", f"{out}/ckpt.dat", "--checksum=xxh3", **env)
    assert copied.returncode == 0, copied.stderr
    assert copied.stdout.strip() == "402:0"
    at_end = cli(d, "copy", "--at-end", "$BB_SCRATCH/final.dat", f"{out}/final.dat", **env)
    assert at_end.returncode == 0 and at_end.stdout.strip() == "402:1", at_end.stderr
    waited = cli(d, "wait", **env)
    assert waited.returncode == 0, waited.stderr
    assert file_digest(out / "ckpt.dat") == file_digest(ckpt)
    assert (out / "ckpt.dat").stat().st_uid == uid
    assert not (out / "final.dat").exists()  # --at-end: after the job
    status = json.loads(cli(d, "status", "--json", "402", **env).stdout)
    kinds = {r["id"]: (r["kind"], r["state"]) for r in status["directives"]}
    assert kinds == {"402:0": ("copy", "done"), "402:1": ("at_end", "pending")}
    shown = cli(d, "status", "402", **env).stdout
    assert "#0 copy done" in shown and "added at run time" in shown
    digest = file_digest(final)
    assert d.hook("slurm_bb_data_out", "402", str(area / "job402.sh")) == (0, "")
    assert file_digest(out / "final.dat") == digest
    assert d.hook("slurm_bb_job_teardown", "402", str(area / "job402.sh"), "false")[0] == 0
    assert not scratch.exists()


def test_a_copy_into_another_users_job_is_refused(api: tuple[Daemon, int], area: Path) -> None:
    d, port = api
    scratch = running_job(d, area, "403")
    env = {"BBSTAGE_API": f"127.0.0.1:{port}", "SLURM_JOB_ID": "403"}
    out = cli(d, "copy", "$BB_SCRATCH/x", "/tmp/x", user="bbuser2", **env)
    assert out.returncode != 0 and "no staging job of yours" in out.stderr
    local = cli(d, "copy", "$BB_SCRATCH/x", "/tmp/x", user="bbuser2", SLURM_JOB_ID="403")
    assert local.returncode != 0 and "no staging job of yours" in local.stderr
    status = json.loads(cli(d, "status", "--json", "403").stdout)
    assert status["directives"] == [] and scratch.exists()
    # A job bbstage does not know gets the same words: the answer tells no one whose job it
    # is, and says what makes a job a staging job.
    unknown = cli(d, "copy", "$BB_SCRATCH/x", "/tmp/x", user="bbuser2", SLURM_JOB_ID="999403")
    assert unknown.returncode == out.returncode
    assert unknown.stderr.replace("999403", "403") == local.stderr
    assert "#BB_LUA pool=NAME capacity=SIZE" in unknown.stderr


def test_a_root_only_source_is_refused_as_a_directive_is(
    api: tuple[Daemon, int], area: Path
) -> None:
    d, port = api
    secret = area / "secret"
    secret.mkdir(mode=0o700)
    (secret / "key").write_bytes(b"root's secret\n")
    uid, gid = user_ids()
    (area / "out2").mkdir()
    out = user_tree(area / "out2", uid, gid)
    running_job(d, area, "404")
    env = {"BBSTAGE_API": f"127.0.0.1:{port}", "SLURM_JOB_ID": "404"}
    copied = cli(d, "copy", str(secret / "key"), f"{out}/key", "--wait", **env)
    assert copied.returncode == 1
    assert "Permission denied" in copied.stderr or "permission" in copied.stderr.lower()
    assert not (out / "key").exists()
    waited = cli(d, "wait", **env)
    assert waited.returncode == 1 and "404:0 failed" in waited.stderr


def test_a_copy_is_checked_by_the_directives_rules_and_needs_a_running_job(
    api: tuple[Daemon, int], area: Path
) -> None:
    d, port = api
    running_job(d, area, "405")
    env = {"BBSTAGE_API": f"127.0.0.1:{port}", "SLURM_JOB_ID": "405"}
    bad = cli(d, "copy", "$BB_SCRATCH/../etc/passwd", "/tmp/x", **env)
    assert bad.returncode != 0 and ".." in bad.stderr
    rel = cli(d, "copy", "relative", "/tmp/x", **env)
    assert rel.returncode != 0 and "relative path" in rel.stderr
    uid, gid = user_ids()
    job = script(area / "job406.sh")
    assert d.hook("slurm_bb_setup", "406", str(uid), str(gid), "(null)", "0", job) == (0, "")
    early = cli(d, "copy", "$BB_SCRATCH/x", "/tmp/x", BBSTAGE_API=f"127.0.0.1:{port}",
                SLURM_JOB_ID="406")  # fmt: skip
    assert early.returncode != 0 and "is not running" in early.stderr


def test_a_copy_running_at_the_jobs_end_is_waited_for_and_survives_a_daemon_kill(
    api: tuple[Daemon, int], area: Path, munged: Munged
) -> None:
    """SIGKILL of the daemon while an in-job copy runs: after the restart the copy is run
    again and ends done with every byte; the job's stage-out waits for it. A ``bbstage wait``
    started while no daemon runs rides out its absence and sees the copy done."""
    d, port = api
    uid, gid = user_ids()
    (area / "out3").mkdir()
    out = user_tree(area / "out3", uid, gid)
    scratch = running_job(d, area, "407")
    big = scratch / "big"
    big.mkdir()
    for i in range(40):
        (big / f"f{i:02d}").write_bytes(os.urandom(4 << 20))
    user_tree(scratch, uid, gid)
    env = {"BBSTAGE_API": f"127.0.0.1:{port}", "SLURM_JOB_ID": "407"}
    copied = cli(d, "copy", "$BB_SCRATCH/big/", f"{out}/big/", **env)
    assert copied.returncode == 0, copied.stderr
    d.kill()  # at once: the copy of 160 MiB is under way
    waiting = subprocess.Popen(  # while no daemon answers
        ["runuser", "-u", "bbuser1", "--", sys.executable, "-m", "bbstage.cli.main",
         "--config", str(d.config), "wait", "--timeout", "90"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )  # fmt: skip
    d2 = start_daemon(d.root, extra=(f'metrics_address = ""\napi_address = "127.0.0.1:{port}"\n'
                      f'munge_socket = "{munged.socket}"\njob_check = "state"'))  # fmt: skip
    try:
        waited = cli(d2, "wait", "--timeout", "60", **env)  # resumed with no hook's help
        assert waited.returncode == 0, waited.stderr
        _, stderr = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, f"the wait started while no daemon ran: {stderr}"
        assert d2.hook("slurm_bb_data_out", "407", str(area / "job407.sh")) == (0, "")
        status = json.loads(cli(d2, "status", "--json", "407", **env).stdout)
        assert [(r["kind"], r["state"]) for r in status["directives"]] == [("copy", "done")]
        for f in big.iterdir():
            assert file_digest(out / "big" / f.name) == file_digest(f), f.name
        assert not [p for p in (out / "big").iterdir() if p.name.startswith(".")]
        log = (d.root / "daemon.log").read_text()
        assert '"copy": 0' in log.split('"daemon started"')[-2], "not resumed: it had ended"
    finally:
        d2.stop()


def test_a_cancelled_copy_fails_nothing(api: tuple[Daemon, int], area: Path) -> None:
    """An --at-end copy cancelled before the job ends is not staged out and fails nothing;
    an in-job copy cancelled (or already done) neither."""
    d, port = api
    uid, gid = user_ids()
    (area / "out4").mkdir()
    out = user_tree(area / "out4", uid, gid)
    scratch = running_job(d, area, "408")
    (scratch / "t").mkdir()
    for i in range(40):
        (scratch / "t" / f"f{i:02d}").write_bytes(os.urandom(4 << 20))
    user_tree(scratch, uid, gid)
    env = {"BBSTAGE_API": f"127.0.0.1:{port}", "SLURM_JOB_ID": "408"}
    assert cli(d, "copy", "$BB_SCRATCH/t/", f"{out}/t/", **env).stdout.strip() == "408:0"
    late = cli(d, "copy", "--at-end", "$BB_SCRATCH/t/", f"{out}/late/", **env)
    assert late.stdout.strip() == "408:1", late.stderr
    cancelled = cli(d, "cancel", "408:0", **env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout in ("408:0 cancelled\n", "408:0 done\n")  # it may have ended
    dropped = cli(d, "cancel", "408:1", **env)
    assert dropped.returncode == 0 and dropped.stdout == "408:1 cancelled\n", dropped.stderr
    assert d.hook("slurm_bb_data_out", "408", str(area / "job408.sh")) == (0, "")
    status = json.loads(cli(d, "status", "--json", "408").stdout)
    assert status["state"] == "staged_out"
    assert not (out / "late").exists()


def test_the_jobs_stage_out_waits_for_its_running_in_job_copies(
    api: tuple[Daemon, int], area: Path
) -> None:
    """The job ends while its in-job copy runs (its worker stopped by SIGSTOP midway):
    data_out does not answer until the copy has ended, then the job is staged out with every
    byte of the copy at its destination."""
    d, port = api
    uid, gid = user_ids()
    (area / "out5").mkdir()
    out = user_tree(area / "out5", uid, gid)
    scratch = running_job(d, area, "409")
    (scratch / "t").mkdir()
    for i in range(40):
        (scratch / "t" / f"f{i:02d}").write_bytes(os.urandom(4 << 20))
    user_tree(scratch, uid, gid)
    env = {"BBSTAGE_API": f"127.0.0.1:{port}", "SLURM_JOB_ID": "409"}
    names = sorted(f.name for f in (scratch / "t").iterdir())

    def caught(dest: Path) -> tuple[list[int]] | None:
        """(the workers,) stopped while a file of the copy into ``dest`` is half written;
        ([],) when that copy ended first (160 MiB may be copied between two looks); None:
        neither yet."""
        if list(dest.rglob(".*.part")):
            pids = worker_pids(d.proc.pid)
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            if list(dest.rglob(".*.part")):
                return (pids,)
            for pid in pids:  # the file landed meanwhile: look again
                os.kill(pid, signal.SIGCONT)
            return None
        return ([],) if sorted(p.name for p in dest.glob("f*")) == names else None

    copies: list[Path] = []
    stopped: list[int] = []
    while not stopped:  # another copy until one is caught under way
        assert len(copies) < 20, "no copy caught under way in 20"
        dest = out / f"t{len(copies)}"
        asked = cli(d, "copy", "$BB_SCRATCH/t/", f"{dest}/", **env).stdout.strip()
        assert asked == f"409:{len(copies)}"
        copies.append(dest)
        (stopped,) = wait_until(
            lambda dest=dest: caught(dest), 60, f"the copy into {dest} to run or end"
        )
    answer: list[tuple[int, str]] = []
    hook = threading.Thread(
        target=lambda: answer.append(d.hook("slurm_bb_data_out", "409", str(area / "job409.sh")))
    )
    try:
        hook.start()
        time.sleep(2)
        assert not answer, f"data_out answered {answer} while the in-job copy was stopped"
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    hook.join(120)
    assert answer == [(0, "")]
    for dest in copies:  # every copy whole, the one caught under way too
        for f in (scratch / "t").iterdir():
            assert file_digest(dest / f.name) == file_digest(f), dest / f.name
    status = json.loads(cli(d, "status", "--json", "409").stdout)
    assert status["state"] == "staged_out"
    assert [(r["kind"], r["state"]) for r in status["directives"]] == [("copy", "done")] * len(
        copies
    )


def test_an_in_job_copy_over_the_api_must_come_from_one_of_the_jobs_nodes(
    area: Path, munged: Munged, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``job_check = "slurm"`` with a stand-in ``squeue``/``scontrol`` (no Slurm here; the
    cluster test asks a real one): job 410 runs on node ``n1``. While ``n1``'s NodeAddr is
    another host's, a copy request over the API from 127.0.0.1 is refused naming the origin;
    once it is 127.0.0.1 the same request is accepted. The Unix socket (on the daemon's own
    host, the kernel's word on the uid) is not asked for an origin."""
    uid, _ = user_ids()
    fake = area / "slurm-bin"
    fake.mkdir()
    addr = area / "n1.addr"
    addr.write_text("10.255.0.1\n")
    (fake / "squeue").write_text(f"#!/bin/sh\necho '410 RUNNING {uid} n1'\n")
    (fake / "scontrol").write_text(f'#!/bin/sh\necho "NodeName=n1 NodeAddr=$(cat {addr})"\n')
    for tool in ("squeue", "scontrol"):
        (fake / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    port = free_port()
    extra = (f'metrics_address = ""\napi_address = "127.0.0.1:{port}"\n'
             f'munge_socket = "{munged.socket}"\njob_check = "slurm"')  # fmt: skip
    d = start_daemon(area / "d", extra=extra)
    try:
        running_job(d, area, "410")
        env = {"BBSTAGE_API": f"127.0.0.1:{port}", "SLURM_JOB_ID": "410"}
        far = cli(d, "copy", "--at-end", "$BB_SCRATCH/x", "/tmp/x", **env)
        assert far.returncode != 0, far.stdout
        assert "came from 127.0.0.1, which is not one of job 410's nodes (n1)" in far.stderr
        local = cli(d, "copy", "--at-end", "$BB_SCRATCH/y", "/tmp/y", SLURM_JOB_ID="410")
        assert local.returncode == 0, local.stderr
        addr.write_text("127.0.0.1\n")
        near = cli(d, "copy", "--at-end", "$BB_SCRATCH/x", "/tmp/x", **env)
        assert near.returncode == 0, near.stderr
        status = json.loads(cli(d, "status", "--json", "410").stdout)
        assert sorted(x["source"] for x in status["directives"]) == [
            "$BB_SCRATCH/x", "$BB_SCRATCH/y"
        ]  # fmt: skip
    finally:
        d.stop()
