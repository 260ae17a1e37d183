#!/usr/bin/env python3
"""Memory staging a tree of many small files: peak RSS of the daemon and its worker.

Generates ``--files`` × ``--file-size`` files (1,000 per directory, ``bbstage.bench``'s data
set) owned by the test user, starts a real daemon (``tests/hookharness.py``: its own
sockets and state, the real Lua hooks), and stages the tree with 22.05-style hooks (``setup``
starts the copy, a blocking ``data_in`` returns at its end: the time measured) — the path
every job takes: engine, executor, a worker process as the user.
While it runs it samples, every ``SAMPLE_EVERY`` s, the RSS and PSS of the daemon and of
every process under it (the forkserver and the worker), and times ``bbstage status``.
Then it times ``cp -r`` of the same tree as root; the page cache is dropped before each
copy (root). Goal (issue 17, goal 2): at 1,000,000 × 1 KiB, daemon + worker below 150 MB
and within 1.2× of the 100,000-file peak; files/s ≥ 1.3× ``cp -r``.

Each run adds its case (keyed by the file count) to benchmarks/results/memory.json, then
regenerates docs/performance.md unless --no-doc.

Usage: python3 benchmarks/bench_memory.py [--files 100000] [--file-size 1K]
       [--dir /var/tmp/bbstage-bench-memory] [--keep] [--no-doc]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import REPO, check, environment, load_result, save_result

from bbstage.bench import Plan
from bbstage.bench.cache import cache_policy, settle
from bbstage.bench.dataset import generate
from bbstage.units import parse_size
from tests.hookharness import script, start_daemon, user_ids

NAME = "memory"
SAMPLE_EVERY = 0.05
STATUS_TIMES = 4  # `bbstage status` calls timed while the transfer runs
OURS = ("daemon", "worker", "walk")  # the goal's processes: daemon + worker (+ its walk)
GOAL = {"max_mb": 150, "max_growth": 1.2, "min_files_ratio": 1.3}


def processes(daemon: int) -> dict[int, str]:
    """The daemon and every process under it, each named: ``daemon``, ``forkserver`` (its
    child that forks the workers), ``worker`` (a child of the forkserver) or ``other``
    (e.g. multiprocessing's resource tracker), ``walk`` (a worker's child: the process that
    walks a big POSIX tree, ``bbstage.transfer.walkproc``; counted with the worker)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found = {daemon: "daemon"}
    for child in children.get(daemon, []):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                forkserver = b"forkserver" in f.read()
        except OSError:
            continue
        found[child] = "forkserver" if forkserver else "other"
        for grandchild in children.get(child, []) if forkserver else []:
            found[grandchild] = "worker"
            for walk in children.get(grandchild, []):
                found[walk] = "walk"
    return found


def memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process, in bytes; (0, 0) once it is gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) << 10
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) << 10
    except OSError:
        pass
    return rss, pss


def high_water_marks(daemon: int) -> dict[str, int]:
    """Each kind's peak RSS over its life so far (VmHWM, no sampling), summed per kind."""
    marks: dict[str, int] = {}
    for pid, kind in processes(daemon).items():
        try:
            with open(f"/proc/{pid}/status") as f:
                hwm = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM"))
        except (OSError, StopIteration):
            continue
        marks[kind] = marks.get(kind, 0) + hwm
    marks["daemon_worker"] = sum(marks.get(kind, 0) for kind in OURS)
    return marks


class Sampler:
    """Peaks of the daemon's and its processes' memory while a transfer runs: each kind's
    RSS, daemon + worker RSS (the goal's figure), and RSS and PSS summed over all of them
    (PSS shares the pages the forked processes have in common)."""

    def __init__(self, daemon: int) -> None:
        self.daemon, self.stop = daemon, threading.Event()
        self.peak: dict[str, int] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        found, when = {self.daemon: "daemon"}, 0.0
        while not self.stop.is_set():
            if time.monotonic() - when > 0.5:
                found, when = processes(self.daemon), time.monotonic()
            rss_by: dict[str, int] = {}
            total_rss = total_pss = 0
            for pid, kind in found.items():
                rss, pss = memory(pid)
                rss_by[kind] = rss_by.get(kind, 0) + rss
                total_rss, total_pss = total_rss + rss, total_pss + pss
            for kind, rss in rss_by.items():
                self._max(f"{kind}_rss", rss)
            self._max("daemon_worker_rss", sum(rss_by.get(kind, 0) for kind in OURS))
            self._max("all_rss", total_rss)
            self._max("all_pss", total_pss)
            self.stop.wait(SAMPLE_EVERY)

    def _max(self, key: str, value: int) -> None:
        self.peak[key] = max(self.peak.get(key, 0), value)


def chown_tree(path: Path, uid: int, gid: int) -> None:
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(path)], check=True)


def stage(root: Path, data: str, files: int) -> dict:
    """Stage ``data`` through a real daemon; seconds, peaks, status latency."""
    uid, gid = user_ids()
    mine = root / "mine"
    mine.mkdir(mode=0o755)
    chown_tree(mine, uid, gid)
    dst = mine / "dst"
    job = script(root / "job.sh", f"stage_in source={data} destination={dst}/")
    d = start_daemon(root / "daemon")
    try:
        settle("drop")
        sampler = Sampler(d.proc.pid)
        sampler.thread.start()
        status: list[float] = []
        started = time.perf_counter()
        # On 22.05 the setup hook starts staging in at once; data_in waits for the end.
        assert d.hook("slurm_bb_setup", "4242", str(uid), str(gid), "(null)", "0", job)[0] == 0
        hook = subprocess.Popen(
            ["lua5.1", str(REPO / "tests/lua/call_hook.lua"), str(d.etc), "slurm_bb_data_in",
             "4242", job],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        while True:
            t0 = time.perf_counter()
            out = d.cli("status", "4242")
            status.append(time.perf_counter() - t0)
            check(out.returncode == 0, f"bbstage status failed: {out.stderr}")
            try:  # each status costs a Python start: CPU the copy wants, so only a few
                hook.wait(None if len(status) >= STATUS_TIMES else 3.0)
                break
            except subprocess.TimeoutExpired:
                pass
        seconds = time.perf_counter() - started
        hwm = high_water_marks(d.proc.pid)  # the worker idles a while before it exits
        time.sleep(0.2)
        sampler.stop.set()
        sampler.thread.join()
        out = hook.stdout.read() if hook.stdout else ""
        check(out.startswith("rc=0"), f"data_in failed: {out}")
        staged = sum(len(names) for _, _, names in os.walk(dst))
        check(staged == files, f"{staged} files staged of {files}")
        quick = d.cli("status", "4242")
        t0 = time.perf_counter()
        d.cli("status", "4242")
        idle_status = time.perf_counter() - t0
        check(quick.returncode == 0, quick.stderr)
    finally:
        d.stop()
    shutil.rmtree(mine, ignore_errors=True)
    return {
        "seconds": seconds,
        "files_per_s": files / seconds,
        "peak_mb": {k: round(v / 1e6, 1) for k, v in sampler.peak.items()},
        "hwm_mb": {k: round(v / 1e6, 1) for k, v in hwm.items()},
        "status_s_max": max(status),
        "status_s_idle": idle_status,
    }


def cp_r(data: str, root: Path, files: int) -> dict:
    dst = root / "cp-dst"
    settle("drop")
    started = time.perf_counter()
    # GNU time's %M: cp's own peak (a child's ru_maxrss would count Python's pages forked)
    out = subprocess.run(
        ["/usr/bin/time", "-f", "%M", "cp", "-r", data.rstrip("/"), str(dst)],
        capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    check(out.returncode == 0, f"cp -r failed: {out.stderr}")
    shutil.rmtree(dst)
    peak = int(out.stderr.split()[-1]) * 1024
    return {"seconds": seconds, "files_per_s": files / seconds, "peak_mb": round(peak / 1e6, 1)}


def main() -> None:
    from common import parser

    ap = parser(__doc__)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--file-size", default="1K")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bbstage-bench-memory"))
    ap.add_argument("--keep", action="store_true", help="keep the generated tree")
    args = ap.parse_args()
    check(os.geteuid() == 0, "run as root (a real daemon, the test user, dropped caches)")
    cache_policy("drop")
    root = args.dir
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    root.chmod(0o755)
    plan = Plan(args.files, parse_size(args.file_size))
    src = root / f"src-{plan.files}"
    try:
        if not src.exists():
            t0 = time.perf_counter()
            generate(str(src), plan)
            print(f"generated {plan.files} files in {time.perf_counter() - t0:.0f} s")
        uid, gid = user_ids()
        chown_tree(src, uid, gid)
        data = str(src / "data") + "/"
        work = root / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(mode=0o755)
        ours = stage(work, data, plan.files)
        cp = cp_r(data, work, plan.files)
        shutil.rmtree(work, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(src, ignore_errors=True)
    case = {
        "files": plan.files,
        "file_size": plan.file_size,
        "bbstage": ours,
        "cp": cp,
        "files_ratio": ours["files_per_s"] / cp["files_per_s"],
    }
    print(case)
    result = load_result(NAME) or {"goal": GOAL, "cases": {}}
    result["cases"][str(plan.files)] = case
    result["environment"] = environment(python=sys.version.split()[0])
    save_result(NAME, result, doc=not args.no_doc)


if __name__ == "__main__":
    main()
