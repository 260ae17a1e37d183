"""The report's figures, ``docs/img/perf-*.png``: optional (matplotlib), drawn headless."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from common import REPO

IMG = REPO / "docs" / "img"


def pyplot(enabled: bool) -> Any:
    """matplotlib.pyplot (Agg), or None when plots are off or matplotlib is missing."""
    if not enabled:
        return None
    try:
        import matplotlib
    except ImportError:
        print("report.py: matplotlib not installed: no plots", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def image(name: str) -> Path:
    """Where the figure ``name`` goes (the directory is made)."""
    IMG.mkdir(parents=True, exist_ok=True)
    return IMG / name


def link(path: Path, alt: str) -> str:
    """Markdown for the image, relative to docs/ (where performance.md is)."""
    return f"![{alt}]({path.relative_to(IMG.parent).as_posix()})"


def hbars(
    plt: Any,
    name: str,
    labels: list[str],
    values: list[float],
    *,
    color: str | list[str],
    xlabel: str,
    figsize: tuple[float, float],
    log: bool = False,
) -> Path:
    """Horizontal bars, the first label at the bottom; the figure's path."""
    fig, ax = plt.subplots(figsize=figsize)
    ax.barh(labels, values, color=color)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    return save(plt, fig, name)


def grouped_bars(
    plt: Any,
    name: str,
    groups: list[str],
    series: list[tuple[str, str, list[float]]],
    *,
    ylabel: str,
    figsize: tuple[float, float],
    line: tuple[float, str] | None = None,
) -> Path:
    """One bar per (label, color, values) series in each group, side by side; ``line``: a
    dashed horizontal line at (value, its label)."""
    fig, ax = plt.subplots(figsize=figsize)
    width = 0.27 if len(series) <= 3 else 0.8 / len(series)
    middle = (len(series) - 1) / 2
    for i, (label, color, values) in enumerate(series):
        xs = [j + (i - middle) * width for j in range(len(groups))]
        ax.bar(xs, values, width, label=label, color=color)
    if line is not None:
        ax.axhline(line[0], color="black", ls="--", lw=1, label=line[1])
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    return save(plt, fig, name)


def save(plt: Any, fig: Any, name: str) -> Path:
    """Write the figure to docs/img/NAME; its path."""
    path = image(name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
