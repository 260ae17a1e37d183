#!/usr/bin/env python3
"""Worker bounds: the daemon's answer latency during a copy burst, with and without the
workers' cgroup ([movers] cgroups, memory_max, cpus; issue [V] item 5).

Two real daemons (``tests/hookharness.py``: their own sockets and state, the real Lua hooks,
``transfers`` = ``--jobs``) run side by side. *free*'s workers sit in a cgroup with no bound
(memory and cpuacct hierarchies, to measure them the same way); *bounded*'s in one with
``memory_max`` and ``cpus`` (memory, cpu and cpuacct). Each round runs three conditions, in
an order that rotates from round to round:

  idle     both daemons idle;
  burst    ``--jobs`` concurrent stage-ins of one ``--size`` file each (POSIX to POSIX under
           ``--dir``), 22.05-style hooks (``setup``, a blocking ``data_in``), on *free*;
  bounded  the same burst on *bounded*.

While a condition holds, two clients ask the daemon of the condition (both daemons when
idle) questions ``--interval`` s apart, each in its own process: the user socket's ``ping``
(``bbstage.client.call``, Python) and the hook's round trip (``zmtp.lua`` in one lua5.1
process, ``benchmarks/lua/hook_poll_loop.lua``: a ``test_data_in`` of a job the daemon does not
know, answered at once). Per condition: p50/p99/max of each, the burst's wall time and
bytes, the workers' peak memory (``memory.max_usage_in_bytes``, page cache included, reset
before each burst) and CPU seconds (``cpuacct.usage``), the daemon's CPU seconds. Before every
condition: destinations removed, ``sync``, page cache dropped (root), disks idle, a few
untimed requests to both daemons. Claim: with the bound, p99 during a burst stays near idle
(ratio to the same daemon's idle p99 in the same round) and memory stays under the bound.

Needs root, cgroup v1 memory + cpu + cpuacct hierarchies (or v2 with memory and cpu), and
the test user (``scripts/local-cluster up`` makes it). Writes
benchmarks/results/worker_bounds.json and regenerates docs/performance.md unless --no-doc.

Usage: python3 benchmarks/bench_worker_bounds.py [--rounds 3] [--jobs 6] [--size 256M]
       [--memory-max 256M] [--cpus 1] [--interval 0.01] [--idle 3]
       [--dir /var/tmp/bbstage-bench-bounds] [--no-doc]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import REPO, check, environment, fail, lua_version, parser, rotate, save_result

from bbstage.bench.cache import cache_policy, settle
from bbstage.client import call
from bbstage.units import parse_size
from tests.hookharness import Daemon, script, start_daemon, user_ids, user_tree

NAME = "worker_bounds"
CONDITIONS = ["idle", "burst", "bounded"]
LUA_DIR = REPO / "lua"
POLL_LUA = REPO / "benchmarks" / "lua" / "hook_poll_loop.lua"
UNKNOWN_JOB = '{"v":1,"op":"test_data_in","job_id":"999999","uid":"0","gid":"0"}'
WARM = 10  # untimed requests of each kind to each daemon before a condition


# -- cgroups -------------------------------------------------------------------------------


def hierarchies() -> dict[str, Path]:
    """This process's cgroup directory in each hierarchy the benchmark uses: v1 ``memory``,
    ``cpu``, ``cpuacct``; or ``v2`` (memory and cpu enabled)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:
        if line.startswith("0::"):
            base = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            controllers = base / "cgroup.controllers"
            if controllers.exists() and {"memory", "cpu"} <= set(controllers.read_text().split()):
                return {"v2": base}
    found: dict[str, Path] = {}
    for line in lines:
        _, names, where = line.split(":", 2)
        for name in ("memory", "cpu", "cpuacct"):
            if name in names.split(","):
                found.setdefault(name, Path("/sys/fs/cgroup") / names / where.lstrip("/"))
    if not {"memory", "cpu", "cpuacct"} <= set(found):
        fail(f"no memory, cpu and cpuacct cgroups here: {lines}")
    return found


class Group:
    """The workers' cgroup of one daemon: its directories, peak memory and CPU time."""

    def __init__(self, bases: dict[str, Path], bounded: bool) -> None:
        name = f"bbstage-bench-{uuid.uuid4().hex[:8]}"
        kinds = ["v2"] if "v2" in bases else ["memory", "cpuacct"] + (["cpu"] if bounded else [])
        self.dirs = {kind: bases[kind] / name for kind in kinds}
        self.memory = self.dirs.get("v2") or self.dirs["memory"]
        self.cpuacct = self.dirs.get("v2") or self.dirs["cpuacct"]
        self.cpu = self.dirs.get("v2") or self.dirs.get("cpu")

    def toml(self) -> str:
        return ", ".join(f'"{d}"' for d in self.dirs.values())

    def reset_peak(self) -> None:
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            if (self.memory / name).exists():
                try:
                    (self.memory / name).write_text("0\n")  # v1; v2 from 6.12 on
                except OSError:
                    pass

    def peak(self) -> int:
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            if (self.memory / name).exists():
                return int((self.memory / name).read_text())
        return 0

    def limit(self) -> int | None:
        for name in ("memory.limit_in_bytes", "memory.max"):
            if (self.memory / name).exists():
                text = (self.memory / name).read_text().strip()
                return None if text == "max" or int(text) >= 1 << 62 else int(text)
        return None

    def failcnt(self) -> int:
        path = self.memory / "memory.failcnt"
        return int(path.read_text()) if path.exists() else 0

    def cpu_seconds(self) -> float:
        if (self.cpuacct / "cpuacct.usage").exists():
            return int((self.cpuacct / "cpuacct.usage").read_text()) / 1e9
        for line in (self.cpuacct / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        return 0.0

    def throttled(self) -> tuple[int, float]:
        """Periods in which the CPU bound stopped the workers, and for how long (s)."""
        path = self.cpu / "cpu.stat" if self.cpu else None
        if path is None or not path.exists():
            return 0, 0.0
        got = dict(line.split() for line in path.read_text().splitlines())
        if "throttled_time" in got:  # v1: ns
            return int(got["nr_throttled"]), int(got["throttled_time"]) / 1e9
        return int(got.get("nr_throttled", 0)), int(got.get("throttled_usec", 0)) / 1e6

    def remove(self) -> None:
        for d in self.dirs.values():  # empty once the daemon and its workers are gone
            for pid in (d / "cgroup.procs").read_text().split() if d.exists() else ():
                os.kill(int(pid), 9)
        time.sleep(0.2)
        for d in self.dirs.values():
            if d.exists():
                d.rmdir()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the clients ---------------------------------------------------------------------------


def ping_loop(user_socket: str, interval: float, stop: Any, out: Any) -> None:
    """Runs in its own process: ``ping`` on the user socket until ``stop``; puts
    [(start, seconds, ok)] on ``out``."""
    got = []
    while not stop.is_set():
        t0 = time.time()
        c0 = time.perf_counter()
        try:
            call(Path(user_socket), "ping", timeout=10)
            ok = True
        except Exception:  # noqa: BLE001 - counted, not raised: the figure is the answer time
            ok = False
        got.append((t0, time.perf_counter() - c0, ok))
        time.sleep(interval)
    out.put(got)


class Clients:
    """Both clients of one daemon, each in its own process, between ``start`` and ``stop``."""

    def __init__(self, d: Daemon, interval: float, work: Path) -> None:
        self.d, self.interval = d, interval
        self.stopfile = work / f"stop-{uuid.uuid4().hex[:8]}"
        ctx = mp.get_context("fork")
        self.stop_ping, self.queue = ctx.Event(), ctx.Queue()
        self.ping = ctx.Process(
            target=ping_loop,
            args=(str(user_socket(d)), interval, self.stop_ping, self.queue),
            daemon=True,
        )
        self.lua = subprocess.Popen(
            ["lua5.1", str(POLL_LUA), str(LUA_DIR), str(control_socket(d)), UNKNOWN_JOB,
             str(interval), str(self.stopfile)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.ping.start()

    def stop(self, t0: float, t1: float) -> dict[str, list[float]]:
        """Stop both; the answer times (s) of the requests started within [t0, t1]."""
        self.stopfile.touch()
        self.stop_ping.set()
        pings = self.queue.get(timeout=30)
        self.ping.join(10)
        out, _ = self.lua.communicate(timeout=30)
        self.stopfile.unlink()
        hooks = []
        for line in out.splitlines():
            start, secs, status = line.split(" ", 2)
            hooks.append((float(start), float(secs), not status.startswith("error:")))
        got: dict[str, list[float]] = {}
        for kind, rows in (("ping", pings), ("hook", hooks)):
            bad = [r for r in rows if not r[2]]
            check(not bad, f"{kind}: {len(bad)} requests got no answer")
            got[kind] = [secs for start, secs, _ in rows if t0 <= start <= t1]
        return got


def user_socket(d: Daemon) -> Path:
    return d.root / "run" / "user.sock"


def control_socket(d: Daemon) -> Path:
    return d.root / "run" / "control.sock"


def warm(d: Daemon) -> None:
    """A few untimed requests of each kind (code paged back in after a cache drop)."""
    for _ in range(WARM):
        call(user_socket(d), "ping", timeout=10)
    subprocess.run(
        ["lua5.1", str(REPO / "tests" / "lua" / "zmtp_loop.lua"), str(LUA_DIR),
         str(control_socket(d)), str(WARM)],
        check=True, capture_output=True,
    )  # fmt: skip


def stats(times: list[float]) -> dict[str, float]:
    ms = sorted(t * 1e3 for t in times)
    check(len(ms) >= 20, f"only {len(ms)} answers in the window")
    return {
        "n": len(ms),
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[min(len(ms) - 1, max(0, round(0.99 * len(ms)) - 1))],
        "max_ms": ms[-1],
    }


# -- the conditions ------------------------------------------------------------------------


class Bench:
    def __init__(self, args: Any, work: Path, data: list[Path]) -> None:
        self.args, self.work, self.data = args, work, data
        self.cache = cache_policy("auto")
        self.uid, self.gid = user_ids()
        self.jobs = 0

    def settle(self, daemons: list[Daemon]) -> None:
        out = self.work / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(mode=0o755)
        user_tree(out, self.uid, self.gid)
        settle(self.cache)
        for d in daemons:
            warm(d)

    def idle(self, daemons: dict[str, Daemon]) -> dict[str, Any]:
        self.settle(list(daemons.values()))
        clients = {name: Clients(d, self.args.interval, self.work) for name, d in daemons.items()}
        t0 = time.time()
        time.sleep(self.args.idle)
        t1 = time.time()
        return {"seconds": t1 - t0, "latency": {
            name: {kind: stats(times) for kind, times in c.stop(t0, t1).items()}
            for name, c in clients.items()
        }}  # fmt: skip

    def burst(self, d: Daemon, group: Group, others: list[Daemon]) -> dict[str, Any]:
        self.settle([d, *others])
        group.reset_peak()
        fails0, cpu0, daemon0 = group.failcnt(), group.cpu_seconds(), process_cpu(d.proc.pid)
        periods0, throttled0 = group.throttled()
        out = self.work / "out"
        first = self.jobs
        self.jobs += len(self.data)

        def stage(i: int) -> tuple[int, str]:
            src = self.data[i]
            job = script(self.work / "jobs" / f"job{first + i}.sh",
                         f"stage_in source={src} destination={out}/{src.name}")  # fmt: skip
            job_id = str(80000 + first + i)
            rc = d.hook("slurm_bb_setup", job_id, str(self.uid), str(self.gid), "(null)", "0", job)
            if rc[0] != 0:
                return rc
            return d.hook("slurm_bb_data_in", job_id, job)

        clients = Clients(d, self.args.interval, self.work)
        time.sleep(0.2)
        t0 = time.time()
        with ThreadPoolExecutor(len(self.data)) as pool:
            rcs = list(pool.map(stage, range(len(self.data))))
        t1 = time.time()
        latency = clients.stop(t0, t1)
        check(rcs == [(0, "")] * len(self.data), f"stage-ins failed: {rcs}")
        copied = sum((out / p.name).stat().st_size for p in self.data)
        check(copied == sum(p.stat().st_size for p in self.data), "bytes missing at the end")
        for i in range(len(self.data)):
            job = str(self.work / "jobs" / f"job{first + i}.sh")
            check(d.hook("slurm_bb_job_teardown", str(80000 + first + i), job, "false")[0] == 0,
                  "teardown failed")  # fmt: skip
        return {
            "seconds": t1 - t0,
            "bytes": copied,
            "MBps": copied / (t1 - t0) / 1e6,
            "workers_peak_bytes": group.peak(),
            "workers_limit_bytes": group.limit(),
            "workers_failcnt": group.failcnt() - fails0,
            "workers_cpu_s": group.cpu_seconds() - cpu0,
            "workers_throttled_periods": group.throttled()[0] - periods0,
            "workers_throttled_s": group.throttled()[1] - throttled0,
            "daemon_cpu_s": process_cpu(d.proc.pid) - daemon0,
            "latency": {kind: stats(times) for kind, times in latency.items()},
        }


def ratios(rnd: dict[str, Any]) -> dict[str, dict[str, float]]:
    """p99 (and p50) during each burst over the same daemon's idle, in the same round."""
    out: dict[str, dict[str, float]] = {}
    for cond, daemon in (("burst", "free"), ("bounded", "bounded")):
        idle = rnd["idle"]["latency"][daemon]
        got = rnd[cond]["latency"]
        out[cond] = {
            f"{kind}_{q}": got[kind][f"{q}_ms"] / idle[kind][f"{q}_ms"]
            for kind in ("ping", "hook")
            for q in ("p50", "p99")
        }
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=6, help="concurrent stage-ins per burst")
    ap.add_argument("--size", default="256M", help="of each staged file")
    ap.add_argument("--memory-max", default="256M")
    ap.add_argument("--cpus", type=float, default=1.0)
    ap.add_argument("--interval", type=float, default=0.01, help="s between a client's requests")
    ap.add_argument("--idle", type=float, default=3.0, help="s the idle condition lasts")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bbstage-bench-bounds"))
    args = ap.parse_args()
    check(os.geteuid() == 0, "run as root (cgroups, the test user's files)")
    size, memory_max = parse_size(args.size), parse_size(args.memory_max)
    bases = hierarchies()
    free, bounded = Group(bases, bounded=False), Group(bases, bounded=True)

    work = args.dir
    shutil.rmtree(work, ignore_errors=True)
    (work / "data").mkdir(parents=True, mode=0o755)
    (work / "jobs").mkdir(mode=0o755)
    work.chmod(0o755)
    uid, gid = user_ids()
    data = []
    for i in range(args.jobs):
        path = work / "data" / f"f{i}.dat"
        with open(path, "wb") as f:
            for _ in range(0, size, 16 << 20):
                f.write(os.urandom(min(16 << 20, size)))
            f.truncate(size)
        data.append(path)
    user_tree(work / "data", uid, gid)

    base = f'metrics_address = ""\ntransfers = {args.jobs}\n[movers]\n'
    daemons: dict[str, Daemon] = {}
    try:
        daemons["free"] = start_daemon(work / "free", base + f"cgroups = [{free.toml()}]")
        bounds = f'memory_max = "{memory_max}"\ncpus = {args.cpus:g}'
        daemons["bounded"] = start_daemon(
            work / "bounded", base + f"cgroups = [{bounded.toml()}]\n{bounds}"
        )
        bench = Bench(args, work, data)
        rounds = []
        for r in range(args.rounds):
            rnd: dict[str, Any] = {"order": rotate(CONDITIONS, r)}
            for cond in rnd["order"]:
                if cond == "idle":
                    rnd["idle"] = bench.idle(daemons)
                elif cond == "burst":
                    rnd["burst"] = bench.burst(daemons["free"], free, [daemons["bounded"]])
                else:
                    rnd["bounded"] = bench.burst(daemons["bounded"], bounded, [daemons["free"]])
                report(r, cond, rnd[cond])
            rnd["ratios"] = ratios(rnd)
            rounds.append(rnd)
            print(f"round {r + 1} ratios to idle p99: "
                  + ", ".join(f"{c} ping {v['ping_p99']:.2f}x hook {v['hook_p99']:.2f}x"
                              for c, v in rnd["ratios"].items()))  # fmt: skip
    finally:
        for d in daemons.values():
            if d.proc.poll() is None:
                d.stop()
        free.remove()
        bounded.remove()
        shutil.rmtree(work, ignore_errors=True)

    load = os.getloadavg()
    result = {
        "benchmark": "worker bounds: daemon answer latency during a copy burst",
        "settings": {
            "jobs": args.jobs,
            "size": size,
            "memory_max": memory_max,
            "cpus": args.cpus,
            "interval_s": args.interval,
            "idle_s": args.idle,
            "rounds": args.rounds,
            "cache": bench.cache,
            "cgroups": "v2" if "v2" in bases else "v1",
        },
        "rounds": rounds,
        "environment": environment(lua=lua_version(), loadavg_after=[round(x, 2) for x in load]),
    }
    save_result(NAME, result, doc=not args.no_doc)


def report(r: int, cond: str, got: dict[str, Any]) -> None:
    def lat(s: dict[str, dict[str, float]]) -> str:
        return "  ".join(
            f"{k} {v['p50_ms']:.2f}/{v['p99_ms']:.2f}/{v['max_ms']:.1f} ms (n={v['n']})"
            for k, v in s.items()
        )

    if cond == "idle":
        for name, s in got["latency"].items():
            print(f"round {r + 1} idle ({name}): {lat(s)}")
        return
    print(
        f"round {r + 1} {cond}: {got['bytes'] / 2**20:.0f} MiB in {got['seconds']:.2f} s, "
        f"peak {got['workers_peak_bytes'] / 2**20:.0f} MiB, workers {got['workers_cpu_s']:.2f}"
        f" CPU s (throttled {got['workers_throttled_s']:.2f} s in"
        f" {got['workers_throttled_periods']} periods), daemon {got['daemon_cpu_s']:.2f} CPU s;"
        f" {lat(got['latency'])}"
    )


if __name__ == "__main__":
    main()
