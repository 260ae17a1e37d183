"""What the hooks forward of Slurm's job_info (24.05+): the real hooks, a real ZeroMQ ROUTER."""

from __future__ import annotations

import json
from pathlib import Path

from .hookharness import hooks_without_daemon, script
from .luas import lua_fixture
from .test_zmtp_lua import Router

lua = lua_fixture()


def test_start_time_and_priority_reach_the_daemon(lua: str, tmp_path: Path) -> None:
    """Fair share orders a user's transfers by the start Slurm expects, then priority
    (``engine.order_of``): the hooks must send both from job_info."""
    d = hooks_without_daemon(tmp_path, lua)
    router = Router(tmp_path / "control.sock", lambda r, msg: r.reply(msg, b"ok", b""))
    try:
        job = script(tmp_path / "job.sh", "stage_in source=/a destination=/b")
        info = "job_info:start_time=1764300000,priority=4294901757,nodes=n1"
        rc, message = d.hook("slurm_bb_data_in", "340", job, "1001", "1001", info)
        assert rc == 0, message
    finally:
        router.close()
    request = json.loads(router.received[-1][-1])
    assert (request["start_time"], request["priority"]) == (1764300000, 4294901757)
