"""Conformance of the Python and Lua #BB_LUA parsers (corpus, limits, property tests)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bbstage import directives
from bbstage.directives import parse
from bbstage.movers import Registry
from bbstage.protocol import from_bytes

from .luas import LUAS, interpreter

ROOT = Path(__file__).resolve().parent.parent
CORPUS = sorted((ROOT / "tests" / "corpus").glob("*.json"))
RUNNER = ROOT / "tests" / "lua" / "parse_corpus.lua"

DEFAULT = Registry()  # a site without [backends]: posix and s3


class LuaParser:
    """One Lua process running tests/lua/parse_corpus.lua, fed length-prefixed scripts."""

    def __init__(self, lua: str, site: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            [interpreter(lua), str(RUNNER), str(ROOT / "lua"), *([str(site)] if site else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def parse(self, text: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:  # undecodable bytes (surrogateescape) go to Lua as the bytes they were
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = text.encode("utf-8", "surrogatepass")
        self.proc.stdin.write(b"%d\n" % len(data) + data)
        self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        if not out:
            raise AssertionError(f"lua runner died (exit {self.proc.wait()})")
        if out.startswith(b"!ERR"):
            raise AssertionError(f"Lua parser raised: {out.decode(errors='replace')}")
        return json.loads(out.decode("utf-8", "surrogateescape"))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module", params=LUAS)  # every interpreter: ~1 s each
def lua(request: pytest.FixtureRequest) -> Any:
    parser = LuaParser(request.param)
    yield parser
    parser.close()


def _codes(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"line": e["line"], "code": e["code"]} for e in result["errors"]]


def _check_case(case: dict[str, Any], result: dict[str, Any]) -> None:
    if "errors" in case:
        assert _codes(result) == case["errors"]
        for e in result["errors"]:
            prefix = "script: " if e["line"] == 0 else f"line {e['line']}: "
            assert e["message"].startswith(prefix)
    else:
        assert result["errors"] == []
        expect = {"scratch_names": [], **case["expect"]}
        assert {k: result[k] for k in expect} == expect
    # a staging line after the first command: a warning, in both parsers (the job is accepted)
    warnings = [{"line": w["line"], "code": w["code"]} for w in result["warnings"]]
    assert warnings == case.get("warnings", [])
    for w in result["warnings"]:
        assert w["message"].startswith(f"line {w['line']}: ")


def _load(path: Path) -> dict[str, Any]:
    case = json.loads(path.read_text(encoding="utf-8"))
    assert set(case) - {"warnings"} in (
        {"description", "script", "expect"},
        {"description", "script", "errors"},
    )
    # a byte that is not UTF-8 is written as its surrogate escape, \udcXX (docs/protocol.md):
    # the script must be the canonical text of its bytes, as the daemon would decode them
    script = case["script"]
    assert from_bytes(script.encode("utf-8", "surrogateescape")) == script, path.name
    return case


def test_corpus_size_and_codes() -> None:
    assert len(CORPUS) >= 70
    codes = {e["code"] for p in CORPUS for e in _load(p).get("errors", [])}
    documented = (ROOT / "docs" / "directives.md").read_text(encoding="utf-8")
    for code in codes:
        assert f"`{code}`" in documented, code
    generated = {"line-too-long", "script-too-large", "too-many-directives", "header-too-long"}
    all_codes = {
        "unknown-verb", "unknown-key", "duplicate-key", "missing-value", "empty-value",
        "relative-path", "dot-dot", "bad-scheme", "unterminated-quote", "duplicate-destination",
        "bad-size", "capacity-without-pool", "bad-option-value", "bad-glob", "tree-mismatch",
        "bad-bucket", "control-char", "bad-quote", "bad-escape", "bad-token", "crlf",
        "continuation", "unknown-variable", "profile-without-s3", "capacity-in-value",
        "duplicate-pool", "bad-bb-option", "non-utf8", "dw-unsupported",
    }  # fmt: skip
    assert all_codes - codes == set()
    for code in all_codes | generated:
        assert f"`{code}`" in documented, code
    warned = {w["code"] for p in CORPUS for w in _load(p).get("warnings", [])}
    assert warned == {"late-directive"}
    assert "`late-directive`" in documented


def test_message_templates_identical() -> None:
    lua_src = (ROOT / "lua" / "bbstage" / "directives.lua").read_text(encoding="utf-8")
    block = lua_src.split("local MSGS = [[\n\n", 1)[1].split("\n]]", 1)[0]
    lua_msgs = dict(line.split("\t", 1) for line in block.split("\n"))
    assert lua_msgs == directives.MESSAGES


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_corpus_python(path: Path) -> None:
    case = _load(path)
    _check_case(case, parse(case["script"], DEFAULT))


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_corpus_lua(path: Path, lua: LuaParser) -> None:
    case = _load(path)
    result = lua.parse(case["script"])
    _check_case(case, result)
    assert result == parse(case["script"], DEFAULT)  # messages and partial results agree too


def _canonical(text: str) -> str:
    """The text the daemon gets for the bytes of ``text`` (\\udcc3\\udca9 side by side are é)."""
    return from_bytes(text.encode("utf-8", "surrogateescape"))


def _both(lua: LuaParser, text: str) -> dict[str, Any]:
    py = parse(text, DEFAULT)
    assert lua.parse(text) == py
    return py


def _stage(i: int, pad: int = 0) -> str:
    return f"#BB_LUA stage_in source=/data/{'x' * pad}{i} destination=/fast/{i}\n"


def test_line_limit(lua: LuaParser) -> None:
    base = "#BB_LUA stage_in source=/d/ destination=/f\n"
    fill = directives.MAX_LINE_BYTES - len(base) + 1  # line length without the newline
    ok = f"#!/bin/sh\n#BB_LUA stage_in source=/d/{'a' * fill} destination=/f\n"
    assert len(ok.splitlines()[1]) == directives.MAX_LINE_BYTES
    assert _both(lua, ok)["errors"] == []
    long = ok.replace("/d/", "/d/b")
    assert _codes(_both(lua, long)) == [{"line": 2, "code": "line-too-long"}]
    # bytes, not characters: 2-byte characters push the same character count over the limit
    wide = ok.replace("a", "é", 1)  # one more byte, same character count
    assert _codes(_both(lua, wide)) == [{"line": 2, "code": "line-too-long"}]


def test_script_limit(lua: LuaParser) -> None:
    head = "#!/bin/sh\n" + _stage(1)
    body = "echo\n"
    n = (directives.MAX_SCRIPT_BYTES - len(head)) // len(body)
    ok = head + body * n + "#" * (directives.MAX_SCRIPT_BYTES - len(head) - n * len(body))
    assert len(ok) == directives.MAX_SCRIPT_BYTES
    assert len(_both(lua, ok)["directives"]) == 1
    result = _both(lua, ok + "\n")
    assert _codes(result) == [{"line": 0, "code": "script-too-large"}]
    assert result["directives"] == []


def test_directive_count_limit(lua: LuaParser) -> None:
    lines = [_stage(i) for i in range(directives.MAX_DIRECTIVES)]
    ok = "#!/bin/sh\n" + "".join(lines)
    assert len(_both(lua, ok)["directives"]) == directives.MAX_DIRECTIVES
    over = ok + "#BB_LUA\n" + _stage(999)
    result = _both(lua, over)
    line = directives.MAX_DIRECTIVES + 2
    assert _codes(result) == [{"line": line, "code": "too-many-directives"}]


def test_header_line_limit(lua: LuaParser) -> None:
    limit = directives.MAX_HEADER_LINES
    head = "#!/bin/sh\n" + _stage(1)
    ok = head + "#\n" * (limit - 2) + "./app\n" + "#\n" * 10  # line limit+1 is the command
    assert _both(lua, ok)["errors"] == []
    over = head + "\n" * (limit - 2) + "#\n" + _stage(2)  # empty lines count too
    result = _both(lua, over)
    assert _codes(result) == [{"line": limit + 1, "code": "header-too-long"}]
    assert len(result["directives"]) == 1
    bad = "#!/bin/sh\n#BB_LUA nope\n" + "#\n" * limit
    assert _codes(_both(lua, bad)) == [
        {"line": 2, "code": "unknown-verb"},
        {"line": limit + 1, "code": "header-too-long"},
    ]


def test_error_cap(lua: LuaParser) -> None:
    text = "#!/bin/sh\n" + "#BB_LUA stage_sideways\n" * 30
    result = _both(lua, text)
    assert len(result["errors"]) == directives.MAX_ERRORS
    assert result["errors"][-1]["line"] == directives.MAX_ERRORS + 1


def test_long_comment_header_and_body(lua: LuaParser) -> None:
    comments = "#" + "c" * 60 + "\n"
    text = "#!/bin/sh\n" + comments * 16000 + _stage(1) + "./app\n" + _stage(2) * 100
    result = _both(lua, text)
    assert [d["line"] for d in result["directives"]] == [16002]


def test_never_raises_on_odd_input() -> None:
    for text in ["", "\n", "#", "#BB_LUA", "#BB_LUA\t", "\ud800#BB_LUA", "#BB_LUA x=\ud800"]:
        assert isinstance(parse(text, DEFAULT)["errors"], list)


# --- property tests -------------------------------------------------------------------------

SCRIPTS = [json.loads(p.read_text(encoding="utf-8"))["script"] for p in CORPUS] or ["#!/bin/sh\n"]
PIECES = [
    "stage_in", "stage_out", "source=", "destination=", "checksum=", "overwrite=", "profile=",
    "pool=", "capacity=", "xxh3", "blake2b", "none", "never", "newer", "always", "10G", "0",
    "512m", '"', '\\"', "\\\\", "\\", "=", "/", "//", "..", "/../", ".", "$BB_SCRATCH",
    "$BB_SCRATCH/", "$HOME", "s3://", "s3://bkt/", "s3://Bad_B/", "http://", "*", "?", "[",
    "]", "[a-z]", "%j", "%u", "%%", "é", "漢字", "\x00", "\x07", "\r", "\t", " ", "  ", "\n",
    "#", "#BB_LUA ", "#SBATCH --bb=", '"#BB_LUA ', "#SBATCH ", "x", "/data/in", "/fast/out/",
    "\udce9", "\udcc3", "\udca9", "\udced\udca0\udc80", "\udcff", "s3://bkt/r\udce9s",
    "#DW ", "#DW", "jobdw", "copy_in", "copy_out", "type=", "file", "directory", "list", "name=",
    "access_mode=", "striped", "pfs=", "xfs", "raw", "10GB", "1TiB", "2N", "$DW_JOB_STRIPED",
    "$DW_JOB_PRIVATE/", "$DW_JOB_a_b", "a-b", "persistentdw", "swap", "\n./app\n", "\n  #DW ",
    '#SBATCH --bb="#DW ',
]  # fmt: skip  # \udcXX: the byte XX, not UTF-8 (surrogateescape, as the daemon decodes)

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12
)  # any Unicode except lone surrogates (they cannot be encoded for Lua)
_piece = st.one_of(st.sampled_from(PIECES), _text)


@st.composite
def mutated_scripts(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SCRIPTS))
    for _ in range(draw(st.integers(0, 4))):
        pos = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            text = text[:pos] + draw(_piece) + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 8)) :]
        else:
            text = text[:pos] + draw(_piece) + text[pos + draw(st.integers(1, 4)) :]
    return text


@st.composite
def generated_scripts(draw: st.DrawFn) -> str:
    lines = [draw(st.sampled_from(["#!/bin/bash", "#!/bin/sh", "#SBATCH -N 1", ""]))]
    for _ in range(draw(st.integers(0, 6))):
        prefix = draw(st.sampled_from(["#BB_LUA ", "#BB_LUA\t", "#SBATCH --bb=", "#", "", "#DW "]))
        tokens = draw(st.lists(_piece, max_size=8))
        lines.append(prefix + draw(st.sampled_from([" ", ""])).join(tokens))
    return "\n".join(lines) + draw(st.sampled_from(["", "\n", "\n./app\n"]))


@st.composite
def well_formed_scripts(draw: st.DrawFn) -> str:
    loc = st.sampled_from(
        ["/data/a", "/data/t/", "$BB_SCRATCH", "$BB_SCRATCH/x", "s3://bucket-1/k", "s3://b.b/d/"]
        + ['"/data/with space"', '"/q/\\"x\\""', "/data/*.dat", "/data/%u/%j_%a"]
    )
    lines = ["#!/bin/bash"]
    for _ in range(draw(st.integers(0, 5))):
        verb = draw(st.sampled_from(["stage_in", "stage_out"]))
        opts = draw(st.lists(st.sampled_from(["checksum=xxh3", "overwrite=never"]), max_size=2))
        lines.append(f"#BB_LUA {verb} source={draw(loc)} destination={draw(loc)} {' '.join(opts)}")
    if draw(st.booleans()):
        lines.append(f"#BB_LUA pool={draw(st.sampled_from(['a', 'b_1']))} capacity=3G")
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(mutated_scripts(), generated_scripts(), well_formed_scripts()))
def test_python_and_lua_agree(lua: LuaParser, text: str) -> None:
    text = _canonical(text)
    py = parse(text, DEFAULT)
    assert lua.parse(text) == py
    assert len(py["errors"]) <= directives.MAX_ERRORS
    assert json.loads(json.dumps(py)) == py


@st.composite
def byte_scripts(draw: st.DrawFn) -> str:
    """Scripts with arbitrary bytes, decoded the way ``bbstage validate`` reads files."""
    base = draw(st.sampled_from(SCRIPTS)).encode("utf-8", "surrogateescape")
    pos = draw(st.integers(0, len(base)))
    noise = draw(st.binary(max_size=16))
    return (base[:pos] + noise + base[pos:]).decode("utf-8", "surrogateescape")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(byte_scripts())
def test_python_and_lua_agree_on_raw_bytes(lua: LuaParser, text: str) -> None:
    assert lua.parse(text) == parse(text, DEFAULT)
