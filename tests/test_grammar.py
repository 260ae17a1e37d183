"""The directive grammar's tables have one source, bbstage/directives.py.

``bbstage install-lua`` writes them (``directives.lua_tables()``) into bbstage_site.lua as
``grammar``, which lua/bbstage/directives.lua takes over its own literal copy; that copy, what
the module uses without a site file, must hold the same (numbers of the same Lua type too).
tests/lua/grammar.lua prints the Lua module's tables one value a line; ``canonical`` writes
Python's the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bbstage import directives
from bbstage.cli import luainstall
from bbstage.config import Config
from bbstage.movers import Registry

from .luas import ENDS, LUAS, interpreter, version

REPO = Path(__file__).resolve().parent.parent
DUMP = REPO / "tests" / "lua" / "grammar.lua"
CALL = REPO / "tests" / "lua" / "call_hook.lua"


def canonical(tables: dict[str, object], lua: str) -> dict[str, list[str]]:
    """``tables`` as tests/lua/grammar.lua prints them under ``lua``, by table name."""
    integers = version(lua) >= "5.3"
    out: dict[str, list[str]] = {}

    def walk(name: str, path: str, v: object) -> None:
        if isinstance(v, dict | list):
            items = v.items() if isinstance(v, dict) else enumerate(v, 1)
            for k, x in items:
                walk(name, f'{path}["{k}"]' if isinstance(k, str) else f"{path}[{k}]", x)
            return
        if isinstance(v, bool):
            kind, text = "boolean", str(v).lower()
        elif isinstance(v, int | float):
            kind = ("float" if isinstance(v, float) else "integer") if integers else "number"
            text = format(float(v), ".17g")
        else:
            kind, text = "string", f'"{v}"'
        out.setdefault(name, []).append(f"{path}\t{kind}\t{text}")

    for name, v in tables.items():
        walk(name, name, v)
    return {name: sorted(lines) for name, lines in out.items()}


def lua_tables(lua: str, lua_dir: Path = REPO / "lua", site: Path | None = None) -> dict:
    """directives.lua's tables as loaded by ``lua`` (from ``site`` if given), by name."""
    cmd = [interpreter(lua), str(DUMP), str(lua_dir), *([str(site)] if site else [])]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out: dict[str, list[str]] = {}
    for line in res.stdout.splitlines():
        out.setdefault(line.split("[", 1)[0].split("\t", 1)[0], []).append(line)
    return out


def assert_same(lua: dict[str, list[str]], py: dict[str, list[str]], where: str) -> None:
    differ = [name for name in sorted(set(lua) | set(py)) if lua.get(name) != py.get(name)]
    detail = "".join(
        f"\n  {name}: Lua only {sorted(set(lua.get(name, [])) - set(py.get(name, [])))},"
        f" Python only {sorted(set(py.get(name, [])) - set(lua.get(name, [])))}"
        for name in differ
    )
    assert not differ, f"{where} differs from bbstage/directives.py in {', '.join(differ)}{detail}"


def test_every_table_is_one_of_directives_py() -> None:
    tables = directives.lua_tables()
    assert all(hasattr(directives, name) for name in tables)
    assert set(tables["UNITS"]) == set(directives.UNITS)
    # floats but the bare unit: Lua 5.3+ multiplies a size without integer overflow
    assert {type(v) for u, v in tables["DW_UNITS"].items() if u} == {float}
    assert tables["UNITS"][""] == 1 and type(tables["UNITS"][""]) is int


@pytest.mark.parametrize("lua", LUAS)
def test_the_lua_modules_own_tables_are_the_python_ones(lua: str) -> None:
    py = canonical(directives.lua_tables(), lua)
    assert_same(lua_tables(lua), py, "lua/bbstage/directives.lua (no site file)")


@pytest.mark.parametrize("lua", ENDS)
def test_the_site_files_grammar_is_what_the_lua_module_takes(lua: str, tmp_path: Path) -> None:
    site = tmp_path / "bbstage_site.lua"
    site.write_text(luainstall.site_lua(Config(), "test"))
    assert "\n  grammar = {\n    MAX_SCRIPT_BYTES = 4194304,\n" in site.read_text()
    py = canonical(directives.lua_tables(), lua)
    assert_same(lua_tables(lua, site=site), py, "bbstage_site.lua's grammar")


def test_a_drift_on_either_side_names_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lua = "lua5.4"
    copy = tmp_path / "lua" / "bbstage"
    copy.mkdir(parents=True)
    source = (REPO / "lua" / "bbstage" / "directives.lua").read_text()
    assert source.count("lustre = 1 }") == 1
    (copy / "directives.lua").write_text(source.replace("lustre = 1 }", "lustre = 1, zfs = 1 }"))
    py = canonical(directives.lua_tables(), lua)
    with pytest.raises(AssertionError, match=r"in JOBDW_TYPES\n.*zfs"):
        assert_same(lua_tables(lua, tmp_path / "lua"), py, "the copy")
    monkeypatch.setattr(directives, "ACCESS_MODES", ("striped",))
    with pytest.raises(AssertionError, match=r"in ACCESS_MODES\n"):
        assert_same(lua_tables(lua), canonical(directives.lua_tables(), lua), "the module")


# install-lua run by a Python whose grammar takes a fourth checksum name
PATCHED = """
import sys
from bbstage import directives
directives.OPTION_VALUES["checksum"] += ("sha256",)
directives.OPTION_HINTS["checksum"] = "none, xxh3, blake2b or sha256"
from bbstage.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("lua", ENDS)
def test_the_installed_parser_takes_the_grammar_install_lua_wrote(lua: str, tmp_path: Path) -> None:
    """The hooks as Slurm runs them (bbstage/main.luac) parse by the tables of the Python
    that ran install-lua; the module's committed tables refuse what those take."""
    config = tmp_path / "bbstage.toml"
    config.write_text(f'[daemon]\nsocket = "{tmp_path}/s.sock"\nstate_dir = "{tmp_path}/state"\n')
    etc = tmp_path / "etc"
    cmd = [sys.executable, "-c", PATCHED, "--config", str(config), "install-lua"]
    out = subprocess.run(
        [*cmd, "--lua", version(lua), "--dest", str(etc)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (etc / "bbstage" / "main.luac").exists()
    site = (etc / "bbstage_site.lua").read_text()
    assert "checksum = { none = 1, xxh3 = 1, blake2b = 1, sha256 = 1 }" in site

    def job_process(checksum: str) -> str:
        job = tmp_path / "job.sh"
        job.write_text(
            f"#!/bin/sh\n#BB_LUA stage_in source=/a destination=/b checksum={checksum}\ntrue\n"
        )
        res = subprocess.run(
            [interpreter(lua), str(CALL), str(etc), "slurm_bb_job_process", str(job)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert res.stderr == "", res
        return res.stdout

    assert job_process("sha256").startswith("rc=0\n")
    assert job_process("md5") == (
        'rc=-1\nline 2: stage_in: checksum="md5" is not allowed: use none, xxh3, blake2b or'
        " sha256\n"
    )
    # the module without a site file: the committed tables, as this Python's
    refused = subprocess.run(
        [interpreter(lua), "-e", f'package.path = "{REPO}/lua/?.lua;" .. package.path',
         "-e", 'local r = require("bbstage.directives").parse("#BB_LUA stage_in source=/a'
         ' destination=/b checksum=sha256\\n") io.write(r.errors[1].code)'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert refused.stdout == "bad-option-value"
    python = directives.parse(
        "#BB_LUA stage_in source=/a destination=/b checksum=sha256\n", Registry()
    )
    assert [e["code"] for e in python["errors"]] == ["bad-option-value"]
