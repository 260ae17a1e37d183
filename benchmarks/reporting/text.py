"""How the sections write numbers and the machine they were measured on."""

from __future__ import annotations

from typing import Any


def env_line(env: dict[str, Any], *extra: str) -> str:
    """``Measured <date> on <cpu> (<n> CPUs), Linux <kernel>, <extra>...``."""
    cpus = f" ({env['cpus']} CPUs)" if env.get("cpus") else ""
    parts = [f"Measured {env.get('date', '?')} on {env.get('cpu', '?')}{cpus}"]
    if env.get("kernel"):
        parts.append(f"Linux {env['kernel']}")
    parts += [e for e in extra if e]
    return ", ".join(parts) + "."


def rate(x: float) -> str:
    """A rate with no false precision: whole numbers from 10 up, else 3 digits."""
    return f"{x:.0f}" if x >= 10 else f"{x:.3g}"


def size(n: int) -> str:
    """``4 KiB``, ``64 MiB``: binary units."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover
