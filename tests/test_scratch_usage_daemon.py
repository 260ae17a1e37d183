"""[V] What a job writes into its scratch, beside what it reserved: measured by the daemon,
shown to the user (`bbstage status`) and the admin (`bbstage pools`, the metrics, a log
warning) when it goes over its capacity=. Plus the measure itself on odd trees."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

from bbstage.daemon.usage import measure

from .helpers import free_port, wait_until
from .hookharness import area, script, start_daemon, user_ids  # noqa: F401


def test_the_measure_counts_blocks_once_and_follows_no_link(tmp_path: Path) -> None:
    root = tmp_path / "s"
    (root / "d").mkdir(parents=True)
    (root / "d" / "a").write_bytes(os.urandom(1 << 20))
    os.link(root / "d" / "a", root / "b")  # one inode, two names: counted once
    with open(root / "sparse", "wb") as f:  # 1 GiB long, no block written
        f.truncate(1 << 30)
    outside = tmp_path / "outside"
    outside.write_bytes(os.urandom(4 << 20))
    (root / "link").symlink_to(outside)
    used = measure(root)
    assert used.complete and (1 << 20) <= used.bytes < (1 << 20) + (256 << 10)
    assert not measure(root, most=2).complete
    assert measure(tmp_path / "gone").bytes == 0


def test_a_job_over_its_capacity_is_shown_to_the_user_and_the_admin(
    area: Path,  # noqa: F811
) -> None:
    port = free_port()
    d = start_daemon(area / "d", f'metrics_address = "127.0.0.1:{port}"\nusage_interval = 0.2')
    try:
        uid, gid = user_ids()
        job = script(area / "job.sh", "pool=scratch capacity=1M")
        assert d.hook("slurm_bb_setup", "801", str(uid), str(gid), "scratch", "1048576", job,
                      None)[0] == 0  # fmt: skip
        scratch = area / "d" / "scratch" / "801"
        (scratch / "big").write_bytes(os.urandom(3 << 20))  # the job writes past its 1 MiB
        os.chown(scratch / "big", uid, gid)

        def over() -> dict | None:
            status = json.loads(d.cli("status", "--json", "801", user="bbuser1").stdout)
            return status if status["scratch_over"] else None

        status = wait_until(over, 30, "the measure of the job's scratch")
        assert status["scratch_used"] >= 3 << 20 and status["capacity"] == 1 << 20
        human = d.cli("status", "801", user="bbuser1").stdout
        assert "3.0 MiB used of 1.0 MiB reserved (over the job's capacity=" in human
        pools = json.loads(d.cli("pools", "--json").stdout)
        assert pools["scratch"]["over"] == 1 and pools["scratch"]["used"] >= 3 << 20
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b'bbstage_jobs_over_capacity{pool="scratch"} 1.0' in page
        log = (area / "d" / "daemon.log").read_text()
        assert log.count('"scratch over capacity"') == 1  # once per job, not every measure
    finally:
        d.stop()
