"""The section of the worker-bounds benchmark: the daemon's answer latency while a copy
burst runs, with and without the workers' cgroup, and the workers' memory against the bound."""

from __future__ import annotations

import statistics
from typing import Any

from .text import env_line, size

NAMES = {"idle": "idle", "burst": "burst, no bound", "bounded": "burst, bounded"}


def _lat(s: dict[str, float]) -> str:
    return f"{s['p50_ms']:.2f} / {s['p99_ms']:.2f} / {s['max_ms']:.1f}"


def worker_bounds(result: dict[str, Any], plots: bool) -> list[str]:
    st, rounds = result["settings"], result["rounds"]
    bound = st["memory_max"]
    lines = [
        "## Worker bounds",
        "",
        "`benchmarks/bench_worker_bounds.py`: what the workers' cgroup (`[movers] cgroups`,",
        "`memory_max`, `cpus`; [operations](operations.md#worker-bounds)) buys the daemon while",
        "a burst of copies runs. Two real daemons side by side, the real Lua hooks; a burst is",
        f"{st['jobs']} concurrent stage-ins (22.05-style `setup` + blocking `data_in`) of one",
        f"{size(st['size'])} file each, POSIX to POSIX on the local disk. *burst, no bound*: the",
        "workers in a cgroup without bounds (there only to be measured); *burst, bounded*:",
        f"`memory_max = {size(bound)}`, `cpus = {st['cpus']:g}`. While a condition holds, two",
        f"clients, each in its own process, ask the condition's daemon every {st['interval_s'] * 1e3:g} ms:",  # noqa: E501
        "*ping* on the user socket (Python) and *hook*, a `test_data_in` of an unknown job",
        "through `zmtp.lua` in one lua5.1 process (connection + handshake per request, as a",
        f"hook). *idle*: {st['idle_s']:g} s with no transfer, both daemons asked. Conditions",
        "rotate from round to round; before each: destinations removed, `sync`, page cache",
        f"{'dropped' if st['cache'] == 'drop' else 'kept warm'}, a few untimed requests. Latency",
        "p50 / p99 / max in ms; *p99 × idle*: p99 over the same daemon's idle p99 in the same",
        "round (ping, hook). Workers' peak: `memory.max_usage_in_bytes` (page cache included),",
        "reset before each burst; CPU s: the workers' cgroup's `cpuacct.usage`.",
        "",
        "| round | condition | ping p50 / p99 / max | hook p50 / p99 / max | p99 × idle "
        "| burst s | MB/s | workers' peak | workers CPU s | daemon CPU s |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for i, rnd in enumerate(rounds, 1):
        for cond in rnd["order"]:
            got = rnd[cond]
            if cond == "idle":
                for name, lat in got["latency"].items():
                    lines.append(
                        f"| {i} | idle ({name} daemon) | {_lat(lat['ping'])} | {_lat(lat['hook'])}"
                        " | | | | | | |"
                    )
                continue
            q = rnd["ratios"][cond]
            lat = got["latency"]
            lines.append(
                f"| {i} | {NAMES[cond]} | {_lat(lat['ping'])} | {_lat(lat['hook'])}"
                f" | {q['ping_p99']:.2f}, {q['hook_p99']:.2f} | {got['seconds']:.2f}"
                f" | {got['MBps']:.0f} | {got['workers_peak_bytes'] / 2**20:.0f} MiB"
                f" | {got['workers_cpu_s']:.2f} | {got['daemon_cpu_s']:.2f} |"
            )
    lines.append("")

    def med(cond: str, key: str) -> float:
        return statistics.median(r["ratios"][cond][key] for r in rounds)

    def spread(cond: str, key: str) -> str:
        got = sorted(r["ratios"][cond][key] for r in rounds)
        return f"{got[0]:.2f}–{got[-1]:.2f}"

    peaks = [r["bounded"]["workers_peak_bytes"] for r in rounds]
    free_peaks = [r["burst"]["workers_peak_bytes"] for r in rounds]
    fails = sum(r["bounded"]["workers_failcnt"] for r in rounds)
    secs = {c: statistics.median(r[c]["seconds"] for r in rounds) for c in ("burst", "bounded")}
    cpu = {
        c: statistics.median(r[c]["workers_cpu_s"] for r in rounds) for c in ("burst", "bounded")
    }
    under = max(peaks) <= bound
    periods = [r["bounded"]["workers_throttled_periods"] for r in rounds
               if "workers_throttled_periods" in r["bounded"]]  # fmt: skip
    throttled = [r["bounded"].get("workers_throttled_s", 0.0) for r in rounds]
    cpu_line = (
        f"; the CPU bound throttled them in {' / '.join(map(str, periods))} of its 100 ms"
        f" periods per round ({' / '.join(f'{t:.2f}' for t in throttled)} s)"
        if periods
        else ""
    )
    lines += [
        f"Over {len(rounds)} rounds (median, range across rounds):",
        "",
        f"* p99 during the burst × idle p99: *no bound* ping {med('burst', 'ping_p99'):.2f}×"
        f" ({spread('burst', 'ping_p99')}), hook {med('burst', 'hook_p99'):.2f}×"
        f" ({spread('burst', 'hook_p99')});",
        f"  *bounded* ping {med('bounded', 'ping_p99'):.2f}× ({spread('bounded', 'ping_p99')}),"
        f" hook {med('bounded', 'hook_p99'):.2f}× ({spread('bounded', 'hook_p99')}).",
        f"* p50 × idle p50: *no bound* ping {med('burst', 'ping_p50'):.2f}×, hook"
        f" {med('burst', 'hook_p50'):.2f}×; *bounded* ping {med('bounded', 'ping_p50'):.2f}×,"
        f" hook {med('bounded', 'hook_p50'):.2f}×.",
        f"* Workers' peak memory, bounded: {' / '.join(f'{p / 2**20:.0f}' for p in peaks)} MiB"
        f" against the {size(bound)} bound ({'never above it' if under else '**above it**'};",
        f"  `memory.failcnt` {fails}: charges that met the limit, reclaimed); without the bound"
        f" {' / '.join(f'{p / 2**20:.0f}' for p in free_peaks)} MiB",
        f"  (page cache included: a burst reads and writes {size(st['jobs'] * st['size'])}).",
        f"* Burst wall time: {secs['burst']:.2f} s without, {secs['bounded']:.2f} s with the"
        f" bound; workers' CPU {cpu['burst']:.2f} s without, {cpu['bounded']:.2f} s with"
        f"{cpu_line}.",
        "",
        env_line(
            result["environment"],
            result["environment"].get("lua", ""),
            f"cgroup {st['cgroups']}",
            "load average after the run "
            + ", ".join(f"{x:g}" for x in result["environment"].get("loadavg_after", [])),
        ),
        "",
    ]
    return lines
