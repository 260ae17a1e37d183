"""[D] `bbstage jobs` over 20,000 kept jobs does not hold up the hooks: the list is read in a
thread, through a connection of its own, and a user's own jobs are selected in SQL."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import zmq

from bbstage import client, protocol
from bbstage.daemon.state import Store

from .hookharness import area, start_daemon, user_ids

__all__ = ["area"]

JOBS = 20_000


def _fill(state_dir: Path, uid: int) -> None:
    """JOBS finished jobs of ``uid``, four directives each (kept for retention_days)."""
    Store(state_dir / "state.db").close()  # the schema
    now = time.time()
    db = sqlite3.connect(state_dir / "state.db")
    with db:
        db.executemany(
            "INSERT INTO jobs (job_id, uid, gid, pool, size, scratch, state, created, updated)"
            " VALUES (?, ?, ?, NULL, 0, NULL, 'done', ?, ?)",
            [(str(100_000 + n), uid, uid, now, now) for n in range(JOBS)],
        )
        db.executemany(
            "INSERT INTO directives (job_id, idx, line, verb, source, destination, spec, state)"
            " VALUES (?, ?, 2, 'stage_in', ?, ?, '{}', 'done')",
            [
                (str(100_000 + n), i, f"/data/u/in{n}.{i}", f"/fast/u/in{n}.{i}")
                for n in range(JOBS)
                for i in range(4)
            ],
        )
    db.close()


def test_a_hook_is_answered_while_a_big_jobs_list_is_read(area: Path) -> None:
    uid, _ = user_ids()
    (area / "d" / "state").mkdir(parents=True)
    _fill(area / "d" / "state", uid)
    d = start_daemon(area / "d")
    users = d.root / "run" / "user.sock"
    ctx = zmq.Context()
    hooks = ctx.socket(zmq.REQ)
    hooks.connect(f"ipc://{d.root}/run/control.sock")
    try:
        started = time.monotonic()
        assert len(client.call(users, "jobs", timeout=120)) == JOBS  # root: every job
        alone = time.monotonic() - started
        listing = threading.Thread(
            target=lambda: [client.call(users, "jobs", timeout=120) for _ in range(3)]
        )
        listing.start()
        waits = []
        while listing.is_alive():
            asked = time.monotonic()
            hooks.send(protocol.encode_request("get_status", job_id="100000"))
            assert hooks.recv_multipart()[0] == b"ok"
            waits.append(time.monotonic() - asked)
        listing.join()
        assert alone > 0.5, f"a list of {JOBS} jobs took only {alone:.2f} s: too fast to show"
        # the second slowest: one pause of the machine's own (0.54 s once among 12,250
        # hooks in a CI run of session 33's VM, 0.11-0.14 s otherwise) is not the daemon's;
        # the list on the loop, or on the daemon's connection, holds up one hook per list
        # read (three here)
        slow = sorted(waits)[-2]
        print(f"alone {alone:.2f} s, {len(waits)} hooks, slowest {max(waits):.3f} s")
        assert len(waits) > 5 and slow < min(0.5, alone / 2), (alone, sorted(waits)[-5:])
    finally:
        hooks.close(0)
        ctx.term()
        d.stop()
