"""What ``bbstage bench`` shows: a table on stdout, and a throughput plot (matplotlib)."""

from __future__ import annotations

from typing import Any

from bbstage.bench.model import MB, BenchError


def render(result: dict[str, Any]) -> None:
    """Human-readable table on stdout."""
    from rich.console import Console
    from rich.table import Table

    size = human(result["file_size"])
    title = f"{result['files']} × {size} ({human(result['total_bytes'])})"
    table = Table(title=title)
    for col in ("", "MB/s", "files/s", "seconds", "ours ×"):
        table.add_column(col, justify="right" if col else "left")
    engine = result.get("engine")
    label = f"bbstage on {len(engine['nodes'])} Dask node(s)" if engine else "bbstage"
    table.add_row(
        label,
        f"{result['mb_per_s']:.1f}",
        f"{result['files_per_s']:.0f}",
        f"{result['seconds']:.3f}",
        "",
    )
    for b in result["baselines"].values():
        table.add_row(
            b["command"],
            f"{b['mb_per_s']:.1f}",
            f"{b['files_per_s']:.0f}",
            f"{b['seconds']:.3f}",
            f"{b['ratio']:.2f}×",
        )
    console = Console()
    console.print(table)
    if engine:
        console.print(f"Dask nodes: {', '.join(engine['nodes'])} ({engine['scheduler']})")
    lat = result["latency_ms"]
    if lat:
        console.print(
            f"per-file latency (ms): p50 {lat['p50']:.2f}  p90 {lat['p90']:.2f}  "
            f"p99 {lat['p99']:.2f}  max {lat['max']:.2f}"
        )
    tuning = f", threads {result['threads']}" if "threads" in result else ""
    if "chunk_size" in result:
        tuning += f", chunk {human(result['chunk_size'])}"
    console.print(f"cache: {result['cache']}{tuning}, median of {result['repeat']}")


def human(n: float) -> str:
    """``n`` bytes in binary units: 4 KiB, 1.5 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def require_matplotlib() -> Any:
    """The matplotlib module, or a BenchError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise BenchError(
            "--plot needs matplotlib: pip install 'bbstage[bench]' (or pip install matplotlib)"
        ) from None
    return matplotlib


def plot(result: dict[str, Any], path: str, title: str | None = None) -> None:
    """Throughput over time (MB/s, 0.5 s window) with the baselines' averages as lines."""
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    xs, ys = [], []
    window = 0.5
    j = 0
    for t, b, _files in samples[1:]:
        while samples[j + 1][0] < t - window:
            j += 1
        t0, b0 = samples[j][0], samples[j][1]
        if t > t0:
            xs.append(t)
            ys.append((b - b0) / MB / (t - t0))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(xs, ys, label="bbstage", color="tab:blue")
    ax.axhline(result["mb_per_s"], color="tab:blue", linestyle=":", label="bbstage mean")
    colors = {"cp": "tab:orange", "rsync": "tab:green", "s5cmd": "tab:red", "rclone": "tab:purple"}
    for name, b in result["baselines"].items():
        ax.axhline(b["mb_per_s"], color=colors.get(name, "gray"), linestyle="--", label=name)
    ax.set_xlabel("seconds")
    ax.set_ylabel("MB/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title or f"{result['files']} × {human(result['file_size'])}: throughput over time")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
