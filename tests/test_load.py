"""[G] Load: 500 jobs staged at once through the real protocol (no Slurm); memory bounded."""

from __future__ import annotations

import json
import time
from pathlib import Path

import zmq

from .helpers import wait_until
from .hookharness import area, start_daemon, user_ids, user_tree

__all__ = ["area"]
JOBS = 500


def rss_peak_kib(pid: int) -> int:
    """Peak resident memory (VmHWM) of a process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_500_concurrent_jobs_complete_with_bounded_memory(area: Path) -> None:
    d = start_daemon(area / "d")
    uid, gid = user_ids()
    src = area / "src"
    src.mkdir()
    for i in range(JOBS):
        (src / f"in{i}").write_bytes(i.to_bytes(4, "big") * 256)
    out = area / "out"
    out.mkdir()
    user_tree(src, uid, gid)
    user_tree(out, uid, gid)
    ctx = zmq.Context()

    def call(**fields: object) -> list[bytes]:
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"ipc://{d.root}/run/control.sock")
        sock.send(json.dumps({"v": 1, **fields}).encode())
        assert sock.poll(60_000), f"no reply to {fields['op']}"
        reply = sock.recv_multipart()
        sock.close()
        return reply

    try:
        started = time.monotonic()
        for i in range(JOBS):
            script = f"#!/bin/bash\n#BB_LUA stage_in source={src}/in{i} destination={out}/out{i}\n"
            job = str(1000 + i)
            assert call(op="setup", job_id=job, uid=uid, gid=gid, script=script)[0] == b"ok"
            # 24.05-style: submit and return; all 500 are in flight at once.
            assert call(op="data_in", job_id=job, script=script, wait=False)[0] == b"ok"
        pending = {str(1000 + i) for i in range(JOBS)}

        def all_staged() -> bool:
            for job in list(pending):
                status = call(op="test_data_in", job_id=job)[0]
                assert status in (b"ok", b"busy"), status
                if status == b"ok":
                    pending.discard(job)
            return not pending

        wait_until(all_staged, 600, lambda: f"{len(pending)} unfinished jobs", every=0.2)
        elapsed = time.monotonic() - started
        for i in range(JOBS):
            assert (out / f"out{i}").read_bytes() == (src / f"in{i}").read_bytes()
        peak = rss_peak_kib(d.proc.pid)
        print(f"\n{JOBS} jobs staged in {elapsed:.1f} s; daemon peak RSS {peak / 1024:.1f} MiB")
        assert peak < 400 * 1024, f"daemon peak RSS {peak} KiB"
    finally:
        ctx.term()
        d.stop()
