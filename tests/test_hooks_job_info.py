"""What the hooks forward of Slurm's job_info (24.05+): the real hooks, a real ZeroMQ ROUTER."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .hookharness import REPO, Daemon, script
from .luas import lua_fixture, version
from .test_zmtp_lua import Router

lua = lua_fixture()


def test_start_time_and_priority_reach_the_daemon(lua: str, tmp_path: Path) -> None:
    """Fair share orders a user's transfers by the start Slurm expects, then priority
    (``engine._order_of``): the hooks must send both from job_info."""
    etc, config = tmp_path / "etc", tmp_path / "bbstage.toml"
    config.write_text(f'[daemon]\nsocket = "{tmp_path}/control.sock"\n')
    subprocess.run(
        [sys.executable, "-m", "bbstage.cli", "--config", str(config), "install-lua",
         "--dest", str(etc), "--lua", version(lua)],
        check=True, capture_output=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    router = Router(tmp_path / "control.sock", lambda r, msg: r.reply(msg, b"ok", b""))
    try:
        d = Daemon(tmp_path, config, etc, None, lua)  # type: ignore[arg-type]
        job = script(tmp_path / "job.sh", "stage_in source=/a destination=/b")
        info = "job_info:start_time=1764300000,priority=4294901757,nodes=n1"
        rc, message = d.hook("slurm_bb_data_in", "340", job, "1001", "1001", info)
        assert rc == 0, message
    finally:
        router.close()
    request = json.loads(router.received[-1][-1])
    assert (request["start_time"], request["priority"]) == (1764300000, 4294901757)
