"""The section of the generic backends' benchmark: bbstage against rclone and fsspec's own
``get``/``put``, per store, case and direction."""

from __future__ import annotations

from typing import Any

from .text import env_line, rate, size


def backends(result: dict[str, Any], plots: bool) -> list[str]:
    env, cells = result["environment"], result["results"]
    small = f"{env['files']:,} × {size(env['file_size'])}"
    server = env.get("https_server")  # runs before 2026-11-29 name none: Python's http.server
    https = f"`{server}` serving HTTPS" if server else "an HTTPS server"
    https += " with a test CA"
    lines = [
        f"## {result.get('title', 'Generic backends: gs, az, sftp, https')}",
        "",
        "`benchmarks/bench_backends.py`: each store's local server (`scripts/local-stores`:",
        f"gcp-storage-emulator, Azurite, OpenSSH, {https}), one big file",
        f"({size(env['big'])}) and {small} files each way (https: down only), through",
        "bbstage's generic mover (`worker.transfer` in the benchmark's process), rclone and",
        "fsspec's own `put`/`get`, in rotating order, same data; MB/s of the fastest of",
        f"{env.get('repeat', 1)} run(s) (`--repeat`). Goal (issue [T] #38): {result['goal']}.",
        "× rclone: the fastest run of each; run by run: the median of each run's ratio (the",
        "two timed in the same rotation, as the machine's speed drifts); the goal is met when",
        "both are at least 1.0, not met when both are under it.",
        "Servers and clients share the machine's CPUs: the figures are indicative, and a",
        "client's CPU seconds (bbstage's and fsspec's: the benchmark's process; rclone's: its",
        "process) are time its server did not get.",
        *(
            [f"The copies wrote to an {env['outputs']}: see `outputs_on_a_journal`."]
            if env.get("outputs", "as is") != "as is"
            else []
        ),
        "",
        "| store | case | way | bbstage MB/s | rclone MB/s | fsspec MB/s | × rclone"
        " | run by run | goal | CPU s bbstage / rclone |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    failures = []
    for key, row in cells.items():
        kind, case, way = key.split("/")
        shown = []
        for who in ("bbstage", "rclone", "fsspec"):
            if "mb_per_s" in row.get(who, {}):
                shown.append(rate(row[who]["mb_per_s"]))
            else:
                shown.append("failed")
                error = (row.get(who, {}).get("error") or "?").strip().splitlines()[-1]
                failures.append(f"{who}, {kind} {case} {way}: {error}")
        ratio, median = row.get("ratio_rclone"), row.get("ratio_rclone_median")
        both = [r for r in (ratio, median) if r is not None]
        if not both:
            met = "—"
        elif all(r >= 1.0 for r in both):
            met = "met"
        else:
            met = "NOT met" if all(r < 1.0 for r in both) else "either way"
        times = "—" if ratio is None else f"{ratio:.2f}"
        by_run = "—" if median is None else f"{median:.2f}"
        used = [row.get(who, {}).get("cpu_seconds") for who in ("bbstage", "rclone")]
        cpu = " / ".join("—" if u is None else f"{u:.2f}" for u in used)
        lines.append(
            f"| {kind} | {case} | {way} | {' | '.join(shown)} | {times} | {by_run} | {met}"
            f" | {cpu} |"
        )
    lines.append("")
    if failures:
        lines += ["Failed (the peer's own error, last line):", ""]
        lines += [f"* {f}" for f in failures] + [""]
    load = env.get("load")
    extra = [f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end" if load else ""]
    lines += [env_line(env, *extra), ""]
    return lines
