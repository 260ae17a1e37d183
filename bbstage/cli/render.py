"""Human-readable output of the CLI."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bbstage.protocol import printable

FINAL = ("done", "failed", "cancelled")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _print(line: str) -> None:
    """Paths may hold bytes that are not UTF-8 (docs/protocol.md "Bytes"): shown as \\xNN."""
    print(printable(line))


def status(job: dict[str, Any]) -> None:
    _print(f"job {job['job_id']}: {job['state']}" + (f" ({job['error']})" if job["error"] else ""))
    if job.get("scratch"):
        line = f"scratch: {job['scratch']}"
        if job.get("scratch_used") is not None:
            line += f"  {_size(job['scratch_used'])} used"
            if job.get("capacity"):
                line += f" of {_size(job['capacity'])} reserved"
            if job.get("scratch_over"):
                line += " (over the job's capacity=: the pool's other jobs may run out of space)"
        _print(line)
    for d in job["directives"]:
        arrow = "in " if d["direction"] == "in" else "out"
        kind = d.get("kind", "script")
        if kind != "script":  # bbstage copy: during the job, or --at-end with the stage-outs
            arrow = "copy" if kind == "copy" else "out (added at run time)"
        progress = f"{_size(d['bytes_done'])}/{_size(d['bytes_total'])}"
        files = f"{d['files_done']}/{d['files_total']} files"
        if d.get("files_skipped"):  # FIFOs, sockets, devices: as rsync, never copied
            files += f" ({d['files_skipped']} special files skipped)"
        rate = f"{_size(d['rate_bytes_per_s'])}/s" if d["rate_bytes_per_s"] else "-"
        eta = f"eta {d['eta_s']:.0f}s" if d.get("eta_s") else ""
        _print(
            f"  #{d['index']} {arrow} {d['state']:<9} {d['source']} -> {d['destination']}"
            f"  {progress}  {files}  {rate} {eta}".rstrip()
        )
        if d.get("waiting"):  # waits for a slot: the fair share says why
            _print(f"      {d['waiting']}")
        if d.get("nodes"):  # moved on transfer nodes (Dask)
            _print(f"      nodes: {_nodes(d['nodes'])}")
        if d["error"]:
            _print(f"      error: {d['error']}")


def _nodes(nodes: list[dict[str, Any]]) -> str:
    """``dtn1 12 files 30.0 MiB, dtn2 …``: what each transfer node moved."""
    return ", ".join(f"{n['node']} {n['files']} files {_size(n['bytes'])}" for n in nodes)


def jobs(rows: list[dict[str, Any]]) -> None:
    """The job list; a NODES column when some job ran on transfer nodes (Dask)."""
    nodes = any(r.get("nodes") for r in rows)
    head = f"{'JOBID':>8} {'UID':>6} {'STATE':<12} {'DIRECTIVES':>10} {'PROGRESS':>22}"
    print(head + ("  NODES" if nodes else ""))
    for r in rows:
        progress = f"{_size(r['bytes_done'])}/{_size(r['bytes_total'])}"
        line = (
            f"{r['job_id']:>8} {r['uid']!s:>6} {r['state']:<12}"
            f" {r['done']:>4}/{r['directives']:<5} {progress:>22}"
        )
        line += f"  {','.join(r.get('nodes', []))}" if nodes else ""
        print(line + (f"  ({r['waiting']})" if r.get("waiting") else ""))


def pools(rows: dict[str, dict[str, int]]) -> None:
    print(f"{'POOL':<12} {'CAPACITY':>12} {'RESERVED':>12} {'FREE':>12} {'USED':>12} OVER")
    for name, p in rows.items():
        used = _size(p["used"]) if "used" in p else "-"
        print(
            f"{name:<12} {_size(p['capacity']):>12} {_size(p['reserved']):>12}"
            f" {_size(p['free']):>12} {used:>12} {p.get('over', '-')}"
        )


def watch(fetch: Callable[[], dict[str, Any]], interval: float = 1.0) -> dict[str, Any]:
    """Live view with a progress bar per directive, until the job's staging has finished."""
    from rich.console import Group
    from rich.live import Live
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.text import Text

    job = fetch()
    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[state]}"),
    )
    tasks = {
        d["index"]: bars.add_task(
            printable(f"#{d['index']} {d['direction']:<3} {d['source']} -> {d['destination']}"),
            total=d["bytes_total"] or None,
            state=d["state"],
        )
        for d in job["directives"]
    }

    def header() -> str:
        error = f" ({job['error']})" if job["error"] else ""
        return printable(f"job {job['job_id']}: {job['state']}{error}")

    title = Text(header())
    with Live(Group(title, bars), refresh_per_second=4):
        while True:
            for d in job["directives"]:
                bars.update(
                    tasks[d["index"]],
                    completed=d["bytes_done"],
                    total=d["bytes_total"] or None,
                    state=printable(d["state"] + (f": {d['error']}" if d["error"] else "")),
                )
            title.plain = header()
            busy = job["state"].startswith("staging") or any(
                d["state"] == "running" for d in job["directives"]
            )
            if job["state"] in FINAL or not busy:
                return job
            time.sleep(interval)
            job = fetch()
