"""The section of a results file with no renderer of its own: its numbers in a table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .text import env_line

# A section: (the results file's JSON, draw plots?) -> markdown lines.
Render = Callable[[dict[str, Any], bool], list[str]]


def generic(stem: str) -> Render:
    """The renderer of ``benchmarks/results/<stem>.json``: its ``markdown`` if it has one,
    else a table of every number in it."""

    def render(result: dict[str, Any], plots: bool) -> list[str]:
        title = result.get("title") or result.get("benchmark") or stem
        lines = [f"## {title}", ""]
        if result.get("markdown"):
            return lines + [result["markdown"].rstrip("\n"), ""]
        lines += [
            f"From `benchmarks/results/{stem}.json` (no dedicated renderer in report.py).",
            "",
        ]
        lines += ["| key | value |", "| --- | ---: |"]
        for key, value in leaves(result):
            if not key.startswith("environment"):
                lines.append(f"| {key} | {value:.4g} |")
        lines.append("")
        if isinstance(result.get("environment"), dict):
            lines += [env_line(result["environment"]), ""]
        return lines

    return render


def leaves(obj: Any, prefix: str = "") -> list[tuple[str, float]]:
    """Every number in ``obj`` (booleans are not), keyed by its dotted path."""
    if isinstance(obj, dict):
        out: list[tuple[str, float]] = []
        for k, v in obj.items():
            out += leaves(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(obj, bool) or not isinstance(obj, int | float):
        return []
    return [(prefix, float(obj))]
