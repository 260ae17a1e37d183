"""`bbstage config check`: what an admin should verify before (and after) going live."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from bbstage.cli import luainstall
from bbstage.config import Config

OK, WARN, FAIL = "ok", "warn", "FAIL"


def _owner_safe(path: Path) -> str | None:
    """A directory root trusts must be root-owned and not writable by others."""
    st = path.stat()
    if st.st_uid != 0:
        return f"{path} is owned by uid {st.st_uid}, not root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others (chmod go-w)"
    return None


def _state_dir_private(config: Config) -> list[tuple[str, str]]:
    """The state directory holds every user's paths and errors: root's alone (0700), with
    no pool inside it (a pool root must be reachable by users)."""
    out = []
    state = config.state_dir
    if state.exists() and state.stat().st_mode & 0o077:
        mode = oct(state.stat().st_mode & 0o777)
        out.append((WARN, f"state_dir: {state} is {mode}, open to group or others: chmod 0700"
                          " (state.db is 0600, but keep the directory private)"))  # fmt: skip
    for pool in config.pools:
        if pool.root.resolve().is_relative_to(state.resolve()):
            out.append((WARN, f"pool {pool.name}: {pool.root} is inside state_dir {state}:"
                              " users must reach their scratch, so state_dir could not be"
                              " private; put pools elsewhere"))  # fmt: skip
    return out


def findings(config: Config, slurm_conf_dir: str | None = None) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if os.geteuid() != 0:
        out.append((WARN, "not running as root: ownership checks may be incomplete"))
    if not config.pools:
        out.append((WARN, "no [[pools]]: jobs get no $BB_SCRATCH and capacity= is refused"))
    for pool in config.pools:
        if not pool.root.exists():
            out.append((WARN, f"pool {pool.name}: {pool.root} does not exist (created at setup)"))
        elif problem := _owner_safe(pool.root):
            out.append((FAIL, f"pool {pool.name}: {problem}"))
        else:
            free = shutil.disk_usage(pool.root).free
            level = WARN if free < pool.capacity else OK
            out.append((level, f"pool {pool.name}: {pool.root}, {free} bytes free on disk,"
                               f" capacity {pool.capacity}"))  # fmt: skip
        if pool.capacity % pool.granularity:
            out.append((WARN, f"pool {pool.name}: capacity is not a multiple of granularity"))
    for label, path in (("state_dir", config.state_dir), ("socket dir", config.socket.parent)):
        if path.exists() and (problem := _owner_safe(path)):
            out.append((FAIL, f"{label}: {problem}"))
    out += _state_dir_private(config)
    if shutil.which("squeue") is None:
        out.append((WARN, "squeue not found: the reconciler cannot see cancelled jobs"))
    lua = luainstall.target()
    if problem := luainstall.missing_sources():
        out.append((FAIL, problem))
    elif lua.luac is None:
        out.append((WARN, f"install-lua ships Lua sources only (slower sbatch): {lua.why}"))
    else:
        out.append((OK, f"install-lua precompiles for {lua.why}"))
    if slurm_conf_dir:
        site = Path(slurm_conf_dir) / "bbstage_site.lua"
        expected = luainstall.site_lua(config, "").split("\n", 1)[1]
        if not (Path(slurm_conf_dir) / "burst_buffer.lua").exists():
            out.append((FAIL, f"no burst_buffer.lua in {slurm_conf_dir}: run bbstage install-lua"))
        elif not site.exists() or site.read_text().split("\n", 1)[1] != expected:
            out.append((FAIL, f"{site} does not match this config: run bbstage install-lua"))
        elif (
            (built := luainstall.compiled_for(Path(slurm_conf_dir)))
            and lua.version
            and (built != lua.version)
        ):
            out.append((FAIL, f"hooks in {slurm_conf_dir} are compiled for Lua {built}, Slurm"
                              f" links {lua.version}: run bbstage install-lua"))  # fmt: skip
        else:
            out.append((OK, f"hooks in {slurm_conf_dir} match this config"))
    if not any(level == FAIL for level, _ in out):
        out.append((OK, "configuration is usable"))
    return out


def run(config: Config, slurm_conf_dir: str | None) -> int:
    results = findings(config, slurm_conf_dir)
    for level, message in results:
        print(f"{level:>4}  {message}")
    return 1 if any(level == FAIL for level, _ in results) else 0
