"""Untrusted text reaches Slurm and terminals escaped and bounded (audit #8): a file name a
user chose, an S3 server's error message. The daemon's reply to a hook becomes the job's
reason and a slurmctld log line; ``bbstage status`` prints to an admin's terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bbstage.cli import render
from bbstage.config import Config
from bbstage.daemon import report
from bbstage.daemon.engine import Engine
from bbstage.daemon.state import Store
from bbstage.movers import TransferError
from bbstage.protocol import ERROR_MAX
from bbstage.transfer import Planned
from tests.hookharness import Daemon, area, daemon, script, user_ids, user_tree
from tests.luas import ENDS, lua_fixture
from tests.unit.test_engine import FakeExecutor, ask, setup

lua = lua_fixture(ENDS)  # the real hooks under the oldest and newest Lua

__all__ = ["area", "daemon"]  # the fixtures
FORGED = "a\nslurmctld: error: forged\x1b]0;pwned\x07\u202egpj.exe"
UNSAFE = ("\n", "\r", "\x1b", "\x07", "\u202e")


def test_a_hostile_file_name_is_escaped_in_the_reason_and_in_status(
    daemon: Daemon, area: Path
) -> None:
    uid, gid = user_ids()
    src = area / "src"
    src.mkdir()
    (src / FORGED).write_text("root's")  # root's, 0600: the user's worker cannot read it
    (src / FORGED).chmod(0o600)
    dst = area / "dst"
    dst.mkdir()
    user_tree(dst, uid, gid)
    job = script(area / "job.sh", f"stage_in source={src}/ destination={dst}/in/")
    assert daemon.hook("slurm_bb_setup", "301", str(uid), str(gid), "(null)", "0", job)[0] == 0
    rc, reason = daemon.hook("slurm_bb_data_in", "301", job)
    assert rc != 0
    escaped = "a\\x0aslurmctld: error: forged\\x1b]0;pwned\\x07\\u202egpj.exe"
    assert reason == f"stage_in line 2: permission denied: {src}/{escaped}"
    shown = daemon.cli("status", "301", user="bbuser1")
    assert escaped in shown.stdout
    assert not any(c in shown.stdout.replace("\n", "") for c in UNSAFE)
    assert not any(line.startswith("slurmctld:") for line in shown.stdout.splitlines())
    error = json.loads(daemon.cli("status", "--json", "301").stdout)["directives"][0]["error"]
    assert error == f"permission denied: {src}/{escaped}"


def test_a_ten_mb_s3_error_message_is_bounded_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(tmp_path / "state.db")
    executor = FakeExecutor()
    engine = Engine(Config(socket=tmp_path / "run" / "c.sock"), store, executor)
    message = "InternalError: " + "\x1b[2J" + "x" * (10 << 20)
    executor.outcomes = [(Planned(1, 1), TransferError(f"s3://bkt/k: {message}"))]
    setup(engine, "31", "stage_in source=s3://bkt/k destination=/tmp/k")
    status, reason = ask(engine, "data_in", job_id="31")
    assert status == "error"
    assert len(reason) < ERROR_MAX + 64 and "\x1b" not in reason
    assert reason.startswith("stage_in line 2: s3://bkt/k: InternalError: \\x1b[2Jxxx")
    assert reason.endswith(" more characters)")
    job = store.job("31")
    assert job is not None
    assert len(job.error) < ERROR_MAX + 64 and len(job.directives[0].error) < ERROR_MAX + 64
    capsys.readouterr()  # the log so far (bounded too, not checked here)
    render.status(report.job_status(job))
    out = capsys.readouterr().out
    assert len(out) < 4 * ERROR_MAX and "\x1b" not in out
    store.close()


def test_every_error_for_slurm_is_escaped_and_bounded_whatever_made_it() -> None:
    """``Reply.error`` itself: errors that do not come from the store (a refused setup, a
    pre_run refusal) pass the same choke point; bytes that are not UTF-8 stay bytes."""
    from bbstage.protocol import Reply, from_bytes, reply_frames

    reply = Reply.error("x\n\x1b[2J\u202e" + "y" * (10 << 20))
    assert reply.message.startswith("x\\x0a\\x1b[2J\\u202eyyy") and len(reply.message) < 1100
    assert reply_frames(Reply.error(from_bytes(b"r\xe9s\x9b"))) == [b"error", b"r\xe9s\\x9b"]
