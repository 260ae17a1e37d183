"""`bbstage install-lua`: bytecode for the Lua the site's Slurm links, never another's.

Each case installs into a scratch directory and runs the installed hooks with a real
interpreter (tests/lua/call_hook.lua: its ``slurm.log_error`` writes to stderr).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bbstage.cli import luainstall

from .luas import interpreter, version

REPO = Path(__file__).resolve().parent.parent
DEBIAN_PLUGIN = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm/burst_buffer_lua.so")
ROOT_2411 = Path("/var/tmp/bbstage-slurm-24.11-root")
# What Slurm's slurm_lua.c holds for a Lua 5.4 build: the names it dlopen()s.
PLUGIN_54 = b"\0liblua.so\0liblua-5.4.so\0liblua5.4.so\0liblua5.4.so.0\0liblua.so.5.4\0"
BAD_VERB = "line 3: unknown verb"


def install(
    tmp: Path, *args: str, path: str | None = None, backends: str = "", tables: str = ""
) -> subprocess.CompletedProcess[str]:
    config = tmp / "bbstage.toml"
    enabled = f"[backends]\nenabled = {backends}\n" if backends else ""
    config.write_text(
        f'[daemon]\nsocket = "{tmp}/control.sock"\nstate_dir = "{tmp}/state"\n{enabled}{tables}'
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if path is not None:
        env["PATH"] = path
    cmd = [sys.executable, "-m", "bbstage.cli.main", "--config", str(config), "install-lua"]
    return subprocess.run(
        [*cmd, "--dest", str(tmp / "etc"), *args], capture_output=True, text=True, env=env
    )


def job_process(tmp: Path, lua: str) -> subprocess.CompletedProcess[str]:
    """slurm_bb_job_process of the installed hooks on a script with a bad directive."""
    job = tmp / "job.sh"
    job.write_text("#!/bin/sh\n#BB_LUA stage_in source=/a destination=/b\n#BB_LUA nope\ntrue\n")
    call = REPO / "tests" / "lua" / "call_hook.lua"
    return subprocess.run(
        [interpreter(lua), str(call), str(tmp / "etc"), "slurm_bb_job_process", str(job)],
        capture_output=True,
        text=True,
    )


def bytecode_version(path: Path) -> str:
    """The Lua version in a luac file's header ("\\x1bLua" then 0x51 ... 0x54)."""
    head = path.read_bytes()[:5]
    assert head[:4] == b"\x1bLua", path
    return f"{head[4] >> 4}.{head[4] & 15}"


def test_the_lua_is_read_from_slurms_plugin(tmp_path: Path) -> None:
    # Debian 12's Slurm 22.05 and Debian 13's 24.11 (scripts/local-cluster's root) link 5.1.
    assert luainstall.plugin_lua(DEBIAN_PLUGIN) == "5.1"
    root_plugin = ROOT_2411 / DEBIAN_PLUGIN.relative_to("/")
    if root_plugin.exists():
        assert luainstall.plugin_lua(root_plugin) == "5.1"
    plugin = tmp_path / "burst_buffer_lua.so"
    plugin.write_bytes(b"\x7fELF" + PLUGIN_54)
    assert luainstall.plugin_lua(plugin) == "5.4"
    plugin.write_bytes(b"\x7fELF\0liblua.so\0")  # names no version
    assert luainstall.plugin_lua(plugin) is None
    plugin.write_bytes(b"\x7fELF\0liblua5.1.so\0liblua-5.3.so\0")  # two: no guess
    assert luainstall.plugin_lua(plugin) is None
    assert luainstall.find_plugin() == DEBIAN_PLUGIN


@pytest.mark.parametrize("lua", ["lua5.1", "lua5.2", "lua5.3", "lua5.4"])
def test_compiled_for_the_plugins_lua_and_loaded_without_a_word(lua: str, tmp_path: Path) -> None:
    plugin = tmp_path / "burst_buffer_lua.so"
    plugin.write_bytes(PLUGIN_54.replace(b"5.4", version(lua).encode()))
    out = install(tmp_path, "--slurm-plugin", str(plugin))
    assert out.returncode == 0, out.stderr
    assert f"precompiled for Lua {version(lua)} (read from Slurm's {plugin})" in out.stderr
    etc = tmp_path / "etc"
    compiled = sorted(p.name for p in (etc / "bbstage").glob("*.luac"))
    assert compiled == ["async.luac", "directives.luac", "hooks.luac", "main.luac", "zmtp.luac"]
    assert b"bundled.directives = function(...)" in (etc / "bbstage" / "main.lua").read_bytes()
    for p in (etc / "bbstage").glob("*.luac"):
        assert bytecode_version(p) == version(lua)
    assert f'local LUA = "Lua {version(lua)}"' in (etc / "burst_buffer.lua").read_text()
    res = job_process(tmp_path, lua)
    assert res.stdout.startswith("rc=-1\n" + BAD_VERB) and res.stderr == "", res


def test_bytecode_of_another_lua_is_never_a_silent_slowdown(tmp_path: Path) -> None:
    assert install(tmp_path, "--lua", "5.4").returncode == 0
    res = job_process(tmp_path, "lua5.1")  # a Slurm on Lua 5.1 with hooks built for 5.4
    assert res.stdout.startswith("rc=-1\n" + BAD_VERB), res  # the hooks still work ...
    # ... from source, and slurmctld's log says so (once: the modules come from source too)
    assert res.stderr == (
        "bbstage: bbstage/main.luac is for Lua 5.4, this Slurm runs Lua 5.1; running the Lua"
        " sources instead, slower on every call: run `bbstage install-lua` again\n"
    )
    # and `bbstage config check` fails on it (this host's Slurm 22.05 links Lua 5.1)
    check = subprocess.run(
        [sys.executable, "-m", "bbstage.cli.main", "--config", str(tmp_path / "bbstage.toml"),
         "config", "check", "--slurm-conf-dir", str(tmp_path / "etc")],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert check.returncode == 1
    assert (
        f"FAIL  hooks in {tmp_path}/etc are compiled for Lua 5.4, Slurm links 5.1:"
        " run bbstage install-lua\n"
    ) in check.stdout


def test_a_module_whose_bytecode_does_not_load_is_read_from_source_and_logged(
    tmp_path: Path,
) -> None:
    assert install(tmp_path, "--lua", "5.4").returncode == 0
    etc = tmp_path / "etc"
    for name in ("hooks", "zmtp"):  # what an asynchronous hook loads: bytecode of 5.3
        luac = etc / "bbstage" / f"{name}.luac"
        subprocess.run(
            ["luac5.3", "-s", "-o", str(luac), str(luac.with_suffix(".lua"))], check=True
        )
    call = REPO / "tests" / "lua" / "call_hook.lua"
    res = subprocess.run(
        [interpreter("lua5.4"), str(call), str(etc), "slurm_bb_get_status", "1"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert res.stdout.startswith("rc=-1\nstaging daemon not reachable"), res  # from source
    logged = res.stderr.splitlines()
    assert "hooks.luac" in logged[0] and "running the Lua sources instead" in logged[0]
    assert len(logged) == 2 and "get_status" in logged[1]  # once; then the hook's own error


def test_without_the_matching_luac_sources_only_and_no_stale_bytecode(tmp_path: Path) -> None:
    assert install(tmp_path, "--lua", "5.1").returncode == 0
    bin_dir = tmp_path / "bin"  # a PATH with no luac at all
    bin_dir.mkdir()
    out = install(tmp_path, "--lua", "5.4", path=str(bin_dir))
    assert out.returncode == 0, out.stderr
    assert (
        "bbstage install-lua: Lua sources only, not precompiled (every sbatch pays for compiling"
        " them): Lua 5.4 (--lua 5.4), but no luac5.4 found (Debian: apt-get install lua5.4)"
    ) in out.stderr
    assert list((tmp_path / "etc" / "bbstage").glob("*.luac")) == []
    stub = (tmp_path / "etc" / "burst_buffer.lua").read_text()
    assert "-- Not precompiled: Lua 5.4 (--lua 5.4), but no luac5.4 found" in stub
    res = job_process(tmp_path, "lua5.4")
    assert res.stdout.startswith("rc=-1\n" + BAD_VERB) and res.stderr == "", res


def test_a_plugin_that_names_no_lua_gives_sources_only(tmp_path: Path) -> None:
    assert install(tmp_path, "--lua", "5.1").returncode == 0
    plugin = tmp_path / "burst_buffer_lua.so"
    plugin.write_bytes(b"\x7fELF\0liblua.so\0")
    out = install(tmp_path, "--slurm-plugin", str(plugin))
    assert f"{plugin} names no single Lua version: give --lua 5.N" in out.stderr
    assert list((tmp_path / "etc" / "bbstage").glob("*.luac")) == []
    missing = install(tmp_path, "--slurm-plugin", str(tmp_path / "nope.so"))
    assert missing.returncode == 1
    assert (
        missing.stderr == f"bbstage install-lua: --slurm-plugin {tmp_path}/nope.so: no such file\n"
    )


ARRAY_DRIVER = r"""
local etc, script = arg[1], arg[2]
slurm = { SUCCESS = 0, ERROR = -1, log_info = function() end, log_error = function() end }
dofile(etc .. "/burst_buffer.lua")
-- Slurm pushes job_info numbers with lua_pushnumber: under Lua 5.3+ a float, as here
local rc, message = slurm_bb_setup("129", "1000", "1000", "scratch", "0", script,
	{ array_job_id = 123.0 })
io.write(tostring(rc), " ", tostring(message), "\n")
"""


@pytest.mark.parametrize("lua", ["lua5.1", "lua5.4"])
def test_an_array_tasks_script_is_found_by_an_integer_array_id(lua: str, tmp_path: Path) -> None:
    """A split-off task's script is read from the array's directory: hash.3/job.123, never
    the hash.3.0/job.123.0 a float would give."""
    assert install(tmp_path, "--lua", version(lua)).returncode == 0
    array = tmp_path / "hash.3" / "job.123"
    array.mkdir(parents=True)
    (array / "script").write_text("#!/bin/sh\ntrue\n")
    task = tmp_path / "hash.9" / "job.129" / "script"  # not there yet (bbstage/daemon/slurmdirs.py)
    driver = tmp_path / "driver.lua"
    driver.write_text(ARRAY_DRIVER)
    res = subprocess.run(
        [interpreter(lua), str(driver), str(tmp_path / "etc"), str(task)],
        capture_output=True, text=True,
    )  # fmt: skip
    # the script was read; the request then finds no daemon (none runs here)
    assert res.stdout.startswith("-1 staging daemon not reachable"), res


@pytest.mark.parametrize("lua", ["lua5.1", "lua5.4"])
def test_the_installed_hooks_take_the_enabled_backends_schemes(lua: str, tmp_path: Path) -> None:
    """The parser bundled into main.luac reads the site's schemes as the source module does:
    a gs:// source is accepted at sbatch where [backends] enables gs, refused where not."""
    plugin = tmp_path / "burst_buffer_lua.so"
    plugin.write_bytes(PLUGIN_54.replace(b"5.4", version(lua).encode()))
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\n#BB_LUA stage_in source=gs://my-bucket/k destination=/b\ntrue\n")
    call = REPO / "tests" / "lua" / "call_hook.lua"
    for enabled, expected in (('["gs"]', "rc=0\n"), ("[]", "rc=-1\n")):
        out = install(tmp_path, "--slurm-plugin", str(plugin), backends=enabled)
        assert out.returncode == 0, out.stderr
        res = subprocess.run(
            [interpreter(lua), str(call), str(tmp_path / "etc"), "slurm_bb_job_process", str(job)],
            capture_output=True,
            text=True,
        )
        assert res.stdout.startswith(expected), (enabled, res)


@pytest.mark.parametrize("lua", ["lua5.1", "lua5.4"])
def test_the_installed_hooks_take_only_the_sites_allowed_hosts(lua: str, tmp_path: Path) -> None:
    """main.luac carries ``[https] allowed_hosts`` as the config says when install-lua ran:
    an https:// source on a listed host is accepted at sbatch, another refused naming the
    line, the host:port and the key; after the list changes, install-lua again."""
    plugin = tmp_path / "burst_buffer_lua.so"
    plugin.write_bytes(PLUGIN_54.replace(b"5.4", version(lua).encode()))
    job = tmp_path / "job.sh"
    job.write_text(
        "#!/bin/sh\n#BB_LUA stage_in source=https://Data.example.org/k destination=/b\ntrue\n"
    )
    call = REPO / "tests" / "lua" / "call_hook.lua"
    for hosts, expected in (('["data.example.org"]', "rc=0\n"), ('["data.example.org:8443"]', (
        "rc=-1\nline 2: stage_in: host data.example.org:443 in source"
        ' "https://Data.example.org/k" is not allowed on this site: the administrator may add'
        ' "data.example.org:443" to [https] allowed_hosts in the daemon config'
    ))):  # fmt: skip
        tables = f"[https]\nallowed_hosts = {hosts}\n"
        out = install(tmp_path, "--slurm-plugin", str(plugin), backends='["https"]', tables=tables)
        assert out.returncode == 0, out.stderr
        assert (tmp_path / "etc" / "bbstage" / "main.luac").exists()
        res = subprocess.run(
            [interpreter(lua), str(call), str(tmp_path / "etc"), "slurm_bb_job_process", str(job)],
            capture_output=True,
            text=True,
        )
        assert res.stdout.startswith(expected), (hosts, res)
