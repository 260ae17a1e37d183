"""The worker processes' cgroup: a memory and CPU bound of their own, so that a burst of
copies cannot take the host slurmctld runs on (the daemon and its hooks stay outside it).

The admin names the cgroup's directories (``[movers] cgroups``): one under a cgroup v2
hierarchy (``/sys/fs/cgroup/...``), or one per controller under v1 (``.../memory/...`` and
``.../cpu/...``). The daemon creates them, writes the bounds (``memory_max``, ``cpus``) in
whichever files each directory has (v2: ``memory.max``, ``cpu.max``; v1:
``memory.limit_in_bytes``, ``cpu.cfs_quota_us``), and puts each worker there as it starts,
before it is given a transfer: what a worker starts (a tree's walk) is there too.

Under systemd, v2 allows no process in a cgroup whose controllers are handed to children:
with ``Delegate=`` in the unit and a directory inside the daemon's own cgroup, the daemon
first moves itself into a ``daemon`` leaf beside it (docs/operations.md, "Worker bounds").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PERIOD = 100_000  # µs: the CPU bound's period (the kernel's default)


class CgroupError(Exception):
    """A cgroup could not be set up: names the file and what to do."""


@dataclass(frozen=True)
class Bounds:
    memory_max: int | None = None  # bytes
    cpus: float | None = None  # CPUs' worth of time


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc.strerror}") from None


def _own_v2() -> Path | None:
    """The cgroup v2 directory this process is in, if the unified hierarchy is mounted."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                if (mount / "cgroup.controllers").exists():
                    return mount / line[3:].lstrip("/")
    return None


def _leave_parent(directory: Path) -> None:
    """v2, delegated: the workers' directory is a child of the daemon's own cgroup, which
    may then hold no process: the daemon moves into a ``daemon`` leaf beside it, and hands
    the memory and cpu controllers down."""
    own = _own_v2()
    if own is None or directory.parent.resolve() != own.resolve():
        return
    leaf = own / "daemon"
    leaf.mkdir(exist_ok=True)
    _write(leaf / "cgroup.procs", str(os.getpid()))
    _write(own / "cgroup.subtree_control", "+memory +cpu")


def prepare(directories: tuple[Path, ...], bounds: Bounds) -> None:
    """Create the directories and write the bounds; CgroupError names what failed."""
    for directory in directories:
        if not (directory.parent / "cgroup.procs").exists():
            raise CgroupError(f"{directory}: its parent is no cgroup (no cgroup.procs)")
        _leave_parent(directory)
        directory.mkdir(exist_ok=True)
        if bounds.memory_max is not None:
            for name in ("memory.max", "memory.limit_in_bytes"):
                if (directory / name).exists():
                    _write(directory / name, str(bounds.memory_max))
        if bounds.cpus is not None:
            quota = max(1000, round(bounds.cpus * PERIOD))
            if (directory / "cpu.max").exists():
                _write(directory / "cpu.max", f"{quota} {PERIOD}")
            elif (directory / "cpu.cfs_quota_us").exists():
                _write(directory / "cpu.cfs_period_us", str(PERIOD))
                _write(directory / "cpu.cfs_quota_us", str(quota))
    bound = {d for d in directories for n in ("memory.max", "memory.limit_in_bytes")
             if (d / n).exists()}  # fmt: skip
    if bounds.memory_max is not None and not bound:
        raise CgroupError(
            f"memory_max: none of {', '.join(map(str, directories))} has the"
            " memory controller (v2: enable it in the parent's"
            " cgroup.subtree_control; v1: list a .../memory/... directory)"
        )
    timed = {d for d in directories for n in ("cpu.max", "cpu.cfs_quota_us") if (d / n).exists()}
    if bounds.cpus is not None and not timed:
        raise CgroupError(f"cpus: none of {', '.join(map(str, directories))} has the cpu"
                          " controller")  # fmt: skip


def enter(directories: tuple[Path, ...], pid: int) -> None:
    """Put process ``pid`` (a worker, before its first transfer) into every directory."""
    for directory in directories:
        _write(directory / "cgroup.procs", str(pid))
