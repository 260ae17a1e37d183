#!/usr/bin/env python3
"""Staging overhead per task of a real Slurm job array, vs a no-op burst_buffer.lua.

On the local cluster (``eval "$(scripts/local-cluster up)"`` first), as ``bbuser1``: a job
array of ``--tasks`` (200) tasks, each with ``#BB_LUA pool=scratch capacity=1M``, one
``stage_in`` of a small file into ``$BB_SCRATCH`` and one ``stage_out`` of it back, and a
body that does nothing.

The baseline is the same array (same script, same ``#BB_LUA`` lines) under a no-op
``burst_buffer.lua``: every hook returns ``slurm.SUCCESS`` at once, pools as in
``bbstage_site.lua``. The variants alternate (bbstage, no-op, then no-op, bbstage, ...).
Two measures, both per task, both bbstage minus no-op:

  hook time   Each variant runs behind a timing shim: a ``burst_buffer.lua`` that loads the
              variant's hooks and appends every asynchronous hook's wall time (setup,
              data_in, pre_run, post_run, data_out, teardown, ...: the calls that move or
              wait for data) to a log; a task's hook time is the sum of its hooks. This is
              what staging costs each task, and what the goal (< 25 ms) is judged on.
  makespan    Wall time from ``sbatch`` until every task is COMPLETED with no burst buffer
              left (polled every 0.2 s), divided by the tasks. Slurm starts staged tasks on
              its scheduler cycles (``bf_interval=1``), so this moves by whole seconds
              between identical runs; it is reported, with every run, for context.

The same polling counts the tasks that failed (ended other than COMPLETED) or are held
(pending at priority 0, as burst_buffer/lua leaves a task whose stage-in failed, or with
a ``Held`` reason), and ids seen done stay counted after slurmctld forgets them
(``MinJobAge``, 300 s). During bbstage's runs it samples, about every ``RSS_EVERY`` s,
the daemon's VmRSS (the pid in ``$BBSTAGE_CLUSTER_DIR/run/bbstage.pid``) with the tasks
done so far: no extra Slurm call. Goal 3 of issue [N]: 1,000 tasks, none failed or held,
hook overhead per task no more than at 200 tasks, RSS flat (≤ ``RSS_FLAT`` × its value at
task ``RSS_FROM``) to the end.

To run a variant the cluster's ``etc/burst_buffer.lua`` is replaced (the real hooks move
to ``bench-hooks.lua`` beside it, so they still find their modules) and, in a ``finally``,
reinstalled with ``bbstage --config $BBSTAGE_CONFIG install-lua --dest
$BBSTAGE_CLUSTER_DIR/etc`` (burst_buffer/lua reloads the script when its mtime changes).

Each run adds its case (keyed by the task count) to benchmarks/results/job_array.json,
then regenerates docs/performance.md unless --no-doc.

Usage: eval "$(scripts/local-cluster up)"; python3 benchmarks/bench_job_array.py
       [--tasks 200] [--repeat 1] [--user bbuser1] [--timeout 900] [--no-doc]
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, environment, fail, load_result, parser, rotate, save_result

NAME = "job_array"
GOAL_MS = 25.0
POLL = 0.2
RSS_EVERY = 1.0  # seconds between two samples of the daemon's RSS
RSS_FROM = 100  # the task from which the daemon's RSS must stay flat
RSS_FLAT = 1.1  # flat: RSS at the end <= RSS_FLAT x RSS at task RSS_FROM
ENDED = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
ENDED |= {"DEADLINE", "PREEMPTED"}

NOOP_LUA = """\
-- No-op burst_buffer.lua written by benchmarks/bench_job_array.py for its baseline run;
-- `bbstage install-lua` puts the real hooks back. Every hook succeeds at once.
local HERE = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local site = { pools = {} }
do
	local chunk = loadfile(HERE .. "bbstage_site.lua")
	local ok, values = pcall(chunk or error)
	if ok and type(values) == "table" then site = values end
end
local function ok() return slurm.SUCCESS end
function slurm_bb_pools()
	local items = {}
	for i, p in ipairs(site.pools or {}) do
		items[i] = string.format('{"id":%q,"quantity":%d,"granularity":%d}',
			p.name, p.quantity, p.granularity)
	end
	return slurm.SUCCESS, '{"pools":[' .. table.concat(items, ",") .. "]}"
end
slurm_bb_job_process = ok
slurm_bb_paths = ok
slurm_bb_setup = ok
slurm_bb_data_in = ok
slurm_bb_test_data_in = ok
slurm_bb_real_size = ok
slurm_bb_pre_run = ok
slurm_bb_post_run = ok
slurm_bb_data_out = ok
slurm_bb_test_data_out = ok
slurm_bb_job_teardown = ok
function slurm_bb_get_status() return slurm.SUCCESS, "no-op burst_buffer.lua" end
"""


ASYNC_HOOKS = [
    "slurm_bb_setup",
    "slurm_bb_data_in",
    "slurm_bb_test_data_in",
    "slurm_bb_real_size",
    "slurm_bb_pre_run",
    "slurm_bb_post_run",
    "slurm_bb_data_out",
    "slurm_bb_test_data_out",
    "slurm_bb_job_teardown",
]

TIMING_SHIM = """\
-- Timing shim written by benchmarks/bench_job_array.py; `bbstage install-lua` replaces it.
-- Loads the hooks under test and appends each asynchronous hook's wall time to a log.
-- (lua-socket is required only inside those hooks: never inside slurmctld.)
dofile(%(hooks)s)
local function timed(name, hook)
	return function(...)
		local clock = require("socket").gettime
		local t0 = clock()
		local out = { hook(...) }
		local log = io.open(%(log)s, "a")
		if log then
			local job = tostring((...))
			log:write(string.format("%%s %%s %%.6f %%.6f\\n", name, job, clock() - t0, t0))
			log:close()
		end
		return unpack(out, 1, table.maxn(out))
	end
end
for _, name in ipairs({ %(names)s }) do
	if _G[name] then _G[name] = timed(name, _G[name]) end
end
"""


def cluster() -> tuple[Path, str]:
    """The cluster's etc directory and the daemon config, from scripts/local-cluster's env."""
    for name in ("SLURM_CONF", "BBSTAGE_CLUSTER_DIR", "BBSTAGE_CONFIG"):
        if not os.environ.get(name):
            fail(f'${name} is not set: run  eval "$(scripts/local-cluster up)"  first')
    if os.geteuid() != 0:
        fail("run as root (it submits with runuser and swaps burst_buffer.lua)")
    return Path(os.environ["BBSTAGE_CLUSTER_DIR"]) / "etc", os.environ["BBSTAGE_CONFIG"]


def job_script(work: Path) -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            "#SBATCH --job-name=bbstage-bench-array",
            "#SBATCH --output=/dev/null",
            "#BB_LUA pool=scratch capacity=1M",
            f"#BB_LUA stage_in source={work}/in.dat destination=$BB_SCRATCH/in.dat",
            f"#BB_LUA stage_out source=$BB_SCRATCH/in.dat destination={work}/out/%j.dat",
            "true",
            "",
        ]
    )


def task_ids(spec: str) -> list[int]:
    """The tasks of an ``ArrayTaskId``: ``7``, ``5-199%10`` (a pending remainder), ``3,5-9``."""
    ids: list[int] = []
    for part in spec.split("%")[0].split(","):
        first, _, last = part.partition("-")
        ids += range(int(first), int(last or first) + 1)
    return ids


def outcomes(array_id: str) -> dict[str, set[int]]:
    """The array's task ids by state: ``done`` (COMPLETED, burst buffer torn down),
    ``failed`` (ended otherwise), ``held`` (pending at priority 0 or with a ``Held``
    reason) and ``active`` (the rest, the pending remainder included)."""
    proc = subprocess.run(
        ["scontrol", "show", "job", "-o", array_id], capture_output=True, text=True
    )
    found: dict[str, set[int]] = {"done": set(), "failed": set(), "held": set(), "active": set()}
    for line in proc.stdout.splitlines():
        field = dict(
            re.findall(r"\b(JobState|BurstBufferState|ArrayTaskId|Priority|Reason)=(\S*)", line)
        )
        if "JobState" not in field or "ArrayTaskId" not in field:
            continue
        state = field["JobState"]
        if state == "COMPLETED" and field.get("BurstBufferState", "") in ("", "complete"):
            kind = "done"
        elif state in ENDED:
            kind = "failed"
        elif state == "PENDING" and (
            field.get("Priority") == "0" or "Held" in field.get("Reason", "")
        ):
            kind = "held"
        else:
            kind = "active"
        found[kind].update(task_ids(field["ArrayTaskId"]))
    return found


def daemon_rss() -> tuple[int, float] | None:
    """(pid, VmRSS in MB) of the cluster's bbstage daemon; None when it does not run."""
    try:
        pid = int((Path(os.environ["BBSTAGE_CLUSTER_DIR"]) / "run" / "bbstage.pid").read_text())
        with open(f"/proc/{pid}/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, ValueError, StopIteration):
        return None
    return pid, kb * 1024 / 1e6


def rss_summary(series: list[list[float]], tasks: int) -> dict:
    """RSS at task ``RSS_FROM`` (the first sample there or later; half-way through a
    shorter array), at the end and its peak in between; growth = end / at that task."""
    start = min(RSS_FROM, tasks // 2)
    after = [s for s in series if s[0] >= start]
    if not after:
        return {}
    return {
        "from_task": after[0][0],
        "at_from_mb": after[0][1],
        "end_mb": after[-1][1],
        "max_mb": max(s[1] for s in after),
        "growth": after[-1][1] / after[0][1],
    }


def run_array(
    script: Path, work: Path, user: str, tasks: int, timeout: float, sample: bool
) -> tuple[dict, int]:
    """Submit the array; wait until every task is COMPLETED with no burst buffer left,
    failed or held (held ones are cancelled then). The run's figures and the tasks done;
    with ``sample``, the daemon's RSS against the tasks done, about every ``RSS_EVERY`` s."""
    start = time.perf_counter()
    proc = subprocess.run(
        ["runuser", "-u", user, "--", "sbatch", "--parsable", f"--array=0-{tasks - 1}"]
        + [f"--chdir={work}", str(script)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        fail(f"sbatch refused the array: {proc.stderr.strip()}")
    array_id = proc.stdout.strip().split(";")[0]
    done: set[int] = set()  # slurmctld forgets ended tasks after MinJobAge: keep them
    failed: set[int] = set()
    held: set[int] = set()
    series: list[list[float]] = []
    pids: set[int] = set()
    next_sample = start

    def take_sample() -> None:
        rss = daemon_rss()
        if rss is None:
            fail("the bbstage daemon is not running (pid file or /proc/PID/status)")
        pids.add(rss[0])
        series.append([len(done), round(rss[1], 2)])

    while time.perf_counter() - start < timeout:
        now = outcomes(array_id)
        done |= now["done"]
        failed |= now["failed"]
        held = now["held"] - done - failed
        if sample and time.perf_counter() >= next_sample:
            take_sample()
            next_sample += RSS_EVERY
        if len(done | failed | held) == tasks:
            break
        time.sleep(POLL)
    else:
        subprocess.run(["scancel", array_id], capture_output=True)
        fail(f"array {array_id} not finished after {timeout:.0f} s (cancelled)")
    seconds = time.perf_counter() - start
    if held:
        subprocess.run(["scancel", array_id], capture_output=True)
    if failed or held:
        print(
            f"array {array_id}: {len(failed)} tasks failed, {len(held)} held "
            f"(see scontrol show job {array_id})",
            file=sys.stderr,
        )
    run = {
        "array_id": array_id,
        "seconds": seconds,
        "tasks": len(done),
        "failed": len(failed),
        "held": len(held),
    }
    if sample:
        take_sample()
        run["rss"] = {**rss_summary(series, tasks), "pids": sorted(pids), "series": series}
    return run, len(done)


def install_variant(etc: Path, variant: str, log: Path) -> None:
    """Put the timing shim in place as burst_buffer.lua, in front of the real hooks (moved to
    bench-hooks.lua) or the no-op ones; atomically, with a later mtime."""
    target = etc / "burst_buffer.lua"
    old = target.stat().st_mtime
    hooks = etc / "bench-hooks.lua"
    if variant == "noop":
        hooks.write_text(NOOP_LUA)
    else:
        shutil.copyfile(target, hooks)
    hooks.chmod(0o644)
    names = ", ".join(f'"{n}"' for n in ASYNC_HOOKS)
    shim = TIMING_SHIM % {
        "hooks": json.dumps(str(hooks)),
        "log": json.dumps(str(log)),
        "names": names,
    }
    tmp = etc / ".burst_buffer.lua.bench"
    tmp.write_text(shim)
    tmp.chmod(0o644)
    now = max(time.time(), old + 1)  # the plugin compares whole seconds: make sure it moves
    os.utime(tmp, (now, now))
    os.replace(tmp, target)


def hook_times(log: Path) -> dict[str, dict[str, float]]:
    """{job id: {hook: seconds}} from the shim's log."""
    jobs: dict[str, dict[str, float]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        name, job, seconds = line.split()[:3]
        hooks = jobs.setdefault(job, {})
        hooks[name] = hooks.get(name, 0.0) + float(seconds)
    return jobs


def restore(etc: Path, config: str, noop_mtime: float) -> None:
    """Reinstall the real hooks (and make sure the plugin sees a new mtime)."""
    bbstage = shutil.which("bbstage") or str(REPO / ".venv" / "bin" / "bbstage")
    subprocess.run(
        [bbstage, "--config", config, "install-lua", "--dest", str(etc)],
        check=True,
        capture_output=True,
    )
    target = etc / "burst_buffer.lua"
    if "bench_job_array.py" in target.read_text():
        raise RuntimeError(f"{target}: install-lua did not restore the real hooks")
    (etc / "bench-hooks.lua").unlink(missing_ok=True)
    if int(target.stat().st_mtime) <= int(noop_mtime):
        later = noop_mtime + 1
        os.utime(target, (later, later))


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each variant (medians)")
    ap.add_argument("--user", default="bbuser1")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per array")
    ap.add_argument(
        "--keep-logs",
        metavar="DIR",
        help="copy the shim's hook logs (name, job id, seconds, start) here",
    )
    args = ap.parse_args()

    etc, config = cluster()
    user = pwd.getpwnam(args.user)
    work = Path(tempfile.mkdtemp(prefix="bbstage-bench-array-", dir="/var/tmp"))
    runs: dict[str, list[dict]] = {"bbstage": [], "noop": []}
    try:
        work.chmod(0o755)
        (work / "in.dat").write_bytes(os.urandom(4096))
        (work / "out").mkdir()
        for path in (work / "in.dat", work / "out"):
            os.chown(path, user.pw_uid, user.pw_gid)
        script = work / "job.sh"
        script.write_text(job_script(work))
        script.chmod(0o644)
        for rep in range(args.repeat):
            for variant in rotate(["bbstage", "noop"], rep):
                log = work / f"hooks-{variant}-{rep}.log"
                install_variant(etc, variant, log)
                try:
                    r, done = run_array(
                        script, work, args.user, args.tasks, args.timeout, variant == "bbstage"
                    )
                finally:
                    restore(etc, config, (etc / "burst_buffer.lua").stat().st_mtime)
                staged = len(list((work / "out").iterdir()))
                if variant == "bbstage" and staged != done:
                    fail(f"{staged} tasks staged their file out, {done} completed")
                for f in (work / "out").iterdir():
                    f.unlink()
                if args.keep_logs:
                    os.makedirs(args.keep_logs, exist_ok=True)
                    shutil.copy(log, args.keep_logs)
                times = hook_times(log)
                if len(times) < done:
                    fail(f"{variant}: the timing shim logged {len(times)} tasks, {done} completed")
                r["hook_ms_per_task"] = (
                    statistics.mean(sum(h.values()) for h in times.values()) * 1e3
                )
                r["hook_ms"] = {
                    name: statistics.median(h.get(name, 0.0) for h in times.values()) * 1e3
                    for name in ASYNC_HOOKS
                    if any(name in h for h in times.values())
                }
                runs[variant].append(r)
                rss = r.get("rss", {})
                print(
                    f"{variant:8} ({rep + 1}/{args.repeat}): {r['seconds']:.2f} s, "
                    f"hooks {r['hook_ms_per_task']:.2f} ms per task, "
                    f"{r['failed']} failed, {r['held']} held"
                    + (f", daemon RSS growth {rss['growth']:.2f}x" if "growth" in rss else ""),
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    variants = {
        k: {
            "seconds": statistics.median(r["seconds"] for r in v),
            "hook_ms_per_task": statistics.median(r["hook_ms_per_task"] for r in v),
            "hook_ms": {
                name: statistics.median(r["hook_ms"].get(name, 0.0) for r in v)
                for name in v[0]["hook_ms"]
            },
            "runs": v,
        }
        for k, v in runs.items()
    }
    overhead = variants["bbstage"]["hook_ms_per_task"] - variants["noop"]["hook_ms_per_task"]
    makespan = (variants["bbstage"]["seconds"] - variants["noop"]["seconds"]) * 1e3 / args.tasks
    slurm = subprocess.run(["sinfo", "--version"], capture_output=True, text=True).stdout
    ours = runs["bbstage"]
    growths = [r["rss"]["growth"] for r in ours if "growth" in r["rss"]]
    case = {
        "tasks": args.tasks,
        "variants": variants,
        "overhead_ms_per_task": overhead,
        "makespan_ms_per_task": makespan,
        "met": overhead < GOAL_MS,
        "failed": sum(r["failed"] for r in ours),
        "held": sum(r["held"] for r in ours),
        "rss_growth": max(growths) if growths else None,
        "environment": environment(slurm=slurm.strip()),
    }
    print(
        f"overhead: {overhead:.2f} ms of hook time per task (goal < {GOAL_MS} ms); "
        f"makespan {makespan:+.1f} ms per task"
    )
    result = load_result(NAME)
    result.update(
        benchmark="Slurm job array: bbstage hooks vs no-op burst_buffer.lua",
        goal_ms_per_task=GOAL_MS,
        rss_from_task=RSS_FROM,
        rss_flat_max=RSS_FLAT,
    )
    result.setdefault("cases", {})[str(args.tasks)] = case
    save_result(NAME, result, doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
