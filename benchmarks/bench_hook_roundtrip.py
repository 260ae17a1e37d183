#!/usr/bin/env python3
"""Hook round trip: Lua -> pyzmq ROUTER echo server -> Lua.

Measures what a Slurm burst_buffer/lua hook pays to ask the daemon one question:

  (a) lua/bbstage/zmtp.lua, N requests in one lua5.1 process; every request opens its own
      connection and does the full ZMTP greeting + handshake (a hook does one request).
  (b) a fresh lua5.1 process per request (process start + module load included; timed
      from Python around subprocess.run, so fork/exec from Python is included too).
  (c) baseline: io.popen of a Python pyzmq REQ client (python3 -c ...) from one lua5.1
      process, i.e. what a hook without zmtp.lua would do.

Writes benchmarks/results/hook_roundtrip.json and regenerates
docs/performance.md from the results (benchmarks/report.py).

Usage: python3 benchmarks/bench_hook_roundtrip.py [--n-lua 2000] [--n-fresh 100] [--n-popen 50]
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import zmq
from common import REPO, check, environment, lua_version, parser, save_result

NAME = "hook_roundtrip"
LUA_DIR = REPO / "lua"
LOOP_LUA = REPO / "tests" / "lua" / "zmtp_loop.lua"
REQUEST_LUA = REPO / "tests" / "lua" / "zmtp_request.lua"

REQUEST = '{"v":1,"op":"test_data_in","job_id":"4242","uid":"1000","gid":"1000"}'

# Baseline client, as a hook would run it with io.popen: connect, send, wait (10 s max).
PY_CLIENT = (
    "import sys,zmq;c=zmq.Context();s=c.socket(zmq.REQ);s.linger=0;s.rcvtimeo=10000;"
    "s.connect('ipc://'+sys.argv[1]);s.send(sys.argv[2].encode());"
    "print(' '.join(f.decode() for f in s.recv_multipart()))"
)

# (c): lua5.1 popen_bench.lua <socket> <count> <request>; prints "<seconds> <output>" lines.
POPEN_LUA = r"""
local socket = require("socket")
local path, count, request = arg[1], tonumber(arg[2]), arg[3]
local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local cmd = "python3 -c " .. q(arg[4]) .. " " .. q(path) .. " " .. q(request)
for i = 1, count do
  local t0 = socket.gettime()
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  io.write(("%.9f %s"):format(socket.gettime() - t0, out:gsub("\n", "")), "\n")
end
"""


def serve(path: str, ready: mp.synchronize.Event) -> None:
    """Echo daemon: reply status "ok" and the request as the message."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(f"ipc://{path}")
    ready.set()
    while True:
        ident, delim, *payload = sock.recv_multipart()
        sock.send_multipart([ident, delim, b"ok", b"|".join(payload)])


def stats(times: list[float]) -> dict[str, float]:
    ms = sorted(t * 1e3 for t in times)
    return {
        "n": len(ms),
        "mean_ms": statistics.fmean(ms),
        "median_ms": statistics.median(ms),
        "p95_ms": ms[max(0, int(round(0.95 * len(ms))) - 1)],
        "min_ms": ms[0],
        "max_ms": ms[-1],
    }


def bench_in_process(sock: str, n: int) -> list[float]:
    cmd = ["lua5.1", str(LOOP_LUA), str(LUA_DIR), sock, str(n)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    check(len(out) == n, f"(a) expected {n} lines, got {len(out)}")
    times = []
    for i, line in enumerate(out, 1):
        _, secs, status, message = line.split(" ", 3)
        check(status == "ok" and message == f"req {i}", f"(a) bad reply {line!r}")
        times.append(float(secs))
    return times


def bench_fresh_process(sock: str, n: int) -> list[float]:
    cmd = ["lua5.1", str(REQUEST_LUA), str(LUA_DIR), sock, "10", REQUEST]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        check(proc.returncode == 0 and "frame 2 6f6b" in proc.stdout, f"(b) {proc.stdout!r}")
    return times


def bench_popen_python(sock: str, n: int, tmp: Path) -> list[float]:
    script = tmp / "popen_bench.lua"
    script.write_text(POPEN_LUA)
    cmd = ["lua5.1", str(script), sock, str(n), REQUEST, PY_CLIENT]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    check(len(out) == n, f"(c) expected {n} lines, got {len(out)}")
    times = []
    for line in out:
        secs, reply = line.split(" ", 1)
        check(reply == f"ok {REQUEST}", f"(c) bad reply {line!r}")
        times.append(float(secs))
    return times


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--n-lua", type=int, default=2000)
    ap.add_argument("--n-fresh", type=int, default=100)
    ap.add_argument("--n-popen", type=int, default=50)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bbstage-bench-") as tmpdir:
        tmp = Path(tmpdir)
        sock = str(tmp / "control.sock")
        ready = mp.Event()
        server = mp.Process(target=serve, args=(sock, ready), daemon=True)
        server.start()
        try:
            check(ready.wait(10), "echo server did not start")
            a = bench_in_process(sock, args.n_lua)
            b = bench_fresh_process(sock, args.n_fresh)
            c = bench_popen_python(sock, args.n_popen, tmp)
        finally:
            server.terminate()
            server.join(5)

    results = {
        "zmtp_in_process": stats(a),
        "zmtp_fresh_process": stats(b),
        "popen_python": stats(c),
    }
    result = {
        "benchmark": "hook round trip (Lua -> pyzmq ROUTER echo -> Lua)",
        "results": results,
        "ratio_baseline_over_ours": results["popen_python"]["median_ms"]
        / results["zmtp_in_process"]["median_ms"],
        "ratio_baseline_over_fresh_process": results["popen_python"]["median_ms"]
        / results["zmtp_fresh_process"]["median_ms"],
        "environment": environment(
            lua=lua_version(), pyzmq=zmq.__version__, libzmq=zmq.zmq_version()
        ),
    }

    print(f"{'variant':<48} {'n':>5} {'median ms':>10} {'mean ms':>10} {'p95 ms':>10}")
    for name, key in [
        ("(a) zmtp.lua, one lua5.1 process", "zmtp_in_process"),
        ("(b) zmtp.lua, fresh lua5.1 per request", "zmtp_fresh_process"),
        ("(c) baseline io.popen(python3 pyzmq REQ)", "popen_python"),
    ]:
        s = results[key]
        print(
            f"{name:<48} {s['n']:>5} {s['median_ms']:>10.3f} {s['mean_ms']:>10.3f} "
            f"{s['p95_ms']:>10.3f}"
        )
    print(
        f"baseline/ours (medians, c/a): {result['ratio_baseline_over_ours']:.1f}x; "
        f"c/b: {result['ratio_baseline_over_fresh_process']:.1f}x"
    )

    save_result(NAME, result, doc=not args.no_doc)


if __name__ == "__main__":
    main()
