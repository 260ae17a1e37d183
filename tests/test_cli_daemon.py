"""[D] The CLI and the metrics endpoint against a real daemon, as root and two users."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .hookharness import REPO, Daemon, area, script, staged_job, user_ids

__all__ = ["area"]


@pytest.fixture
def staged(area: Path) -> Iterator[tuple[Daemon, int]]:
    yield from staged_job(area, "201")


def test_metrics_are_scraped_over_http(staged: tuple[Daemon, int]) -> None:
    _, port = staged
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'bbstage_staged_bytes_total{direction="in"} 5000.0' in text
    assert 'bbstage_staged_files_total{direction="in"} 1.0' in text
    assert 'bbstage_transfers_total{direction="in",outcome="done"} 1.0' in text
    assert 'bbstage_pool_reserved_bytes{pool="scratch"} 8.388608e+06' in text
    assert 'bbstage_jobs{state="staged_in"} 1.0' in text
    assert "bbstage_transfers_queued 0.0" in text
    assert 'bbstage_hook_requests_total{hook="data_in",status="ok"} 1.0' in text


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


def test_idle_metrics_connections_stop_neither_a_scrape_nor_the_hooks(
    staged: tuple[Daemon, int],
) -> None:
    """2,000 connections that send nothing (any local user can open them): the daemon keeps
    a bounded number of threads (it had one per connection), a scrape is answered and so is
    a hook."""
    d, port = staged
    before = _threads(d.proc.pid)
    idle = []
    try:
        for _ in range(2000):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert b'bbstage_jobs{state="staged_in"} 1.0' in text
        uid, gid = user_ids()
        job = script(d.root / "job2.sh")
        started = time.monotonic()
        assert (
            d.hook("slurm_bb_setup", "202", str(uid), str(gid), "scratch", "1048576", job)[0] == 0
        )
        assert time.monotonic() - started < 5
        assert _threads(d.proc.pid) < before + 20, (before, _threads(d.proc.pid))
        assert len(list(Path(f"/proc/{d.proc.pid}/fd").iterdir())) < 500
    finally:
        for each in idle:
            each.close()


def test_a_slow_metrics_request_is_closed_after_the_read_timeout(
    staged: tuple[Daemon, int],
) -> None:
    """A slowloris (a header line a second, never the end of the head) is closed within the
    read timeout (5 s), not held for ever."""
    _, port = staged
    with socket.create_connection(("127.0.0.1", port), timeout=2) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 9:
            try:
                slow.sendall(b"X-Slow: 1\r\n")
                slow.settimeout(1)
                closed = slow.recv(1) == b""
            except TimeoutError:
                pass
            except OSError:
                closed = True
        assert closed and time.monotonic() - started < 7


def test_jobs_and_pools_per_identity(staged: tuple[Daemon, int]) -> None:
    d, _ = staged
    mine = json.loads(d.cli("jobs", "--json", user="bbuser1").stdout)
    assert [j["job_id"] for j in mine] == ["201"]
    assert json.loads(d.cli("jobs", "--json", user="bbuser2").stdout) == []
    assert [j["job_id"] for j in json.loads(d.cli("jobs", "--json").stdout)] == ["201"]
    pools = json.loads(d.cli("pools", "--json", user="bbuser2").stdout)
    assert pools["scratch"]["reserved"] == 8 << 20
    assert pools["scratch"]["free"] == (64 << 20) - (8 << 20)
    table = d.cli("jobs")
    assert table.returncode == 0 and "201" in table.stdout and "staged_in" in table.stdout


def test_status_exit_codes_and_messages(staged: tuple[Daemon, int]) -> None:
    d, _ = staged
    ok = d.cli("status", "201", user="bbuser1")
    assert ok.returncode == 0 and "job 201: staged_in" in ok.stdout
    assert d.cli("status", "999", user="bbuser1").returncode == 3
    assert d.cli("status", "x1").returncode == 2
    d.stop()
    down = d.cli("status", "201", user="bbuser1")
    assert down.returncode == 4 and "staging daemon not reachable" in down.stderr


def test_a_login_nodes_client_reads_only_where_the_daemon_listens(
    staged: tuple[Daemon, int], area: Path
) -> None:
    """The site's config on a login node names daemon-side files the node does not have (a
    CA bundle): the daemon would refuse to start with it, the client still asks the daemon."""
    from bbstage import config

    d, _ = staged
    login = area / "login.toml"
    site = d.config.read_text().replace("[daemon]", '[backends]\nenabled = ["https"]\n\n[daemon]')
    login.write_text(site + '\n[https]\nca_bundle = "/nonexistent/site-ca.pem"\n')
    login.chmod(0o644)
    with pytest.raises(config.ConfigError, match="ca_bundle"):
        config.load(login)
    out = subprocess.run(
        ["runuser", "-u", "bbuser1", "--", sys.executable, "-m", "bbstage.cli.main",
         "--config", str(login), "status", "201"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.returncode == 0 and "job 201: staged_in" in out.stdout, out.stderr


def test_every_command_has_help(staged: tuple[Daemon, int]) -> None:
    d, _ = staged
    for cmd in ("status", "validate", "jobs", "pools", "daemon", "install-lua", "config"):
        out = d.cli(cmd, "--help")
        assert out.returncode == 0 and "usage: bbstage" in out.stdout, cmd


def test_control_socket_is_root_only(staged: tuple[Daemon, int]) -> None:
    d, _ = staged
    uid, gid = user_ids()
    job = d.root / "job-user.sh"
    job.write_text("#!/bin/bash\ntrue\n")
    job.chmod(0o644)
    # The hooks, run as a normal user, cannot reach the control socket.
    import subprocess

    from .hookharness import REPO

    out = subprocess.run(
        ["runuser", "-u", "bbuser1", "--", d.lua, str(REPO / "tests/lua/call_hook.lua"),
         str(d.etc), "slurm_bb_setup", "202", str(uid), str(gid), "(null)", "0", str(job)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.stdout.startswith("rc=-1")
    assert "staging daemon not reachable" in out.stdout and "ermission denied" in out.stdout


def test_status_watch_ends_when_staging_has_finished(staged: tuple[Daemon, int]) -> None:
    d, _ = staged
    out = d.cli("status", "201", "--watch", "--interval", "0.1", user="bbuser1")
    assert out.returncode == 0, out.stderr
    assert "job 201: staged_in" in out.stdout and "a.dat" in out.stdout


def test_config_check(staged: tuple[Daemon, int]) -> None:
    d, _ = staged
    ok = d.cli("config", "check", "--slurm-conf-dir", str(d.etc))
    assert ok.returncode == 0, ok.stdout
    assert "hooks in" in ok.stdout and "match this config" in ok.stdout
    (d.etc / "bbstage_site.lua").write_text("return {}\n")
    stale = d.cli("config", "check", "--slurm-conf-dir", str(d.etc))
    assert stale.returncode == 1 and "run bbstage install-lua" in stale.stdout
    bad = d.config.with_name("bad.toml")
    bad.write_text("[daemon]\ntransfer = 4\n")
    typo = d.cli("--config", str(bad), "config", "check")
    assert typo.returncode != 0 and "unknown key 'transfer'" in typo.stderr
