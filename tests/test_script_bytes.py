"""Issue [K], invariant I5: every script gets an answer, whatever bytes it holds.

Bytes that are not UTF-8, CRLF, NUL, very long lines and scripts of Slurm's maximum size
either stage (the staged file's name and content byte for byte) or fail in
slurm_bb_job_process with a line-numbered message, and the daemon gives setup the same
verdict: no script reaches the daemon as a "bad request". Also the user socket's limits.
Encoding of bytes: docs/protocol.md "Bytes".
"""

from __future__ import annotations

import io
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bbstage import client, directives, protocol
from bbstage.cli import render
from bbstage.daemon import server
from bbstage.daemon.state import Store
from bbstage.movers import Registry
from bbstage.protocol import Reply, from_bytes, to_bytes

from .helpers import file_digest, wait_until
from .hookharness import REPO, Daemon, area, daemon, lua, user_ids, user_tree
from .luas import LUAS, interpreter

__all__ = ["area", "daemon", "lua"]  # fixtures: the hook tests run under lua5.1 ... lua5.4

E9 = b"\xe9"  # Latin-1 "é": never valid UTF-8 on its own
# Byte sequences a script may hold that are not UTF-8, and some that are.
ODD = [
    E9,
    b"\x80",  # a lone continuation byte
    b"\xc0\xaf",  # overlong "/"
    b"\xe2\x82",  # a sequence cut short
    b"\xed\xa0\x80",  # UTF-8 bytes of a surrogate
    b"\xf4\x90\x80\x80",  # above U+10FFFF
    b"\xf8\x88\x80\x80\x80",  # a 5-byte form
    b"\xff\xfe",
    "é漢😀".encode(),  # valid UTF-8
]


# --- the hooks' JSON encoder: any bytes in, valid UTF-8 JSON out, the same bytes back ----------


class LuaJson:
    """One Lua running tests/lua/json_string.lua: lua/bbstage/hooks.lua's JSON encoder."""

    def __init__(self, lua: str) -> None:
        self.proc = subprocess.Popen(
            [interpreter(lua), str(REPO / "tests" / "lua" / "json_string.lua"), str(REPO / "lua")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def encode(self, data: bytes) -> bytes:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"%d\n" % len(data) + data)
        self.proc.stdin.flush()
        return self.proc.stdout.readline().rstrip(b"\n")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture(scope="module", params=LUAS)
def lua_json(request: pytest.FixtureRequest) -> Iterator[LuaJson]:
    encoder = LuaJson(request.param)
    yield encoder
    encoder.close()


def _round_trip(lua_json: LuaJson, data: bytes) -> None:
    wire = lua_json.encode(data)
    text = wire.decode("utf-8")  # strict: what the hooks send is valid UTF-8
    assert to_bytes(json.loads(text)["s"]) == data
    request = protocol.decode_request(b'{"v":1,"op":"ping",' + wire[1:], frozenset({"ping"}))
    assert to_bytes(request.fields["s"]) == data


def test_hook_json_carries_every_byte(lua_json: LuaJson) -> None:
    _round_trip(lua_json, bytes(range(256)) * 3)
    _round_trip(lua_json, b"".join(ODD) + b"\n" + b" ".join(ODD) + b'"\\')
    for odd in ODD:
        _round_trip(lua_json, b"#!/bin/sh\n# r" + odd + b"sultat\n" + odd * 3)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(st.binary(max_size=12), st.sampled_from(ODD)), max_size=12))
def test_hook_json_carries_any_bytes(lua_json: LuaJson, pieces: list[bytes]) -> None:
    _round_trip(lua_json, b"".join(pieces))


# --- the daemon's side of the definition ---------------------------------------------------


def test_raw_bytes_that_are_not_utf8_are_no_bad_request() -> None:
    """An older hook (raw bytes in the JSON) means the same as the \\udcXX escape."""
    raw = b'{"v":1,"op":"setup","job_id":"7","script":"# r\xe9sultat\\n"}'
    escaped = b'{"v":1,"op":"setup","job_id":"7","script":"# r\\udce9sultat\\n"}'
    for frame in (raw, escaped):
        request = protocol.decode_request(frame, protocol.HOOK_OPS)
        assert to_bytes(request.fields["script"]) == b"# r\xe9sultat\n"


def test_reply_message_carries_the_bytes() -> None:
    reply = Reply.error(f"cannot open {from_bytes(b'/data/r' + E9)}: denied")
    assert protocol.reply_frames(reply) == [b"error", b"cannot open /data/r\xe9: denied"]
    assert protocol.reply_frames(Reply.error("lone \ud800")) == [b"error", b"lone \xef\xbf\xbd"]


def test_store_keeps_paths_that_are_not_utf8(tmp_path: Path) -> None:
    text = directives.parse(
        from_bytes(b"#BB_LUA stage_in source=/d/r\xe9s destination=$BB_SCRATCH/r\xe9s\n"),
        Registry(),
    )
    assert text["errors"] == []
    store = Store(tmp_path / "state.db")
    store.create_job(
        "9", uid=1, gid=1, pool=None, size=0, scratch=None, directives=text["directives"]
    )
    store.set_directive("9", 0, error=f"cannot read {from_bytes(b'/d/r' + E9)}")
    store.set_job("9", state="failed", error=f"stage-in failed: {from_bytes(b'/d/r' + E9)}")
    store.close()
    again = Store(tmp_path / "state.db").job("9")  # from the database, not the cache
    assert again is not None
    assert to_bytes(again.directives[0].spec["source"]) == b"/d/r\xe9s"  # the exact bytes
    assert again.directives[0].source == "/d/r\\xe9s"  # for display
    assert again.error == "stage-in failed: /d/r\\xe9"


def test_status_prints_paths_that_are_not_utf8(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out, encoding="utf-8", errors="strict"))
    path = from_bytes(b"/d/r\xe9s")
    counts = dict.fromkeys(("bytes_done", "bytes_total", "files_done", "files_total"), 0)
    row = {"index": 0, "direction": "in", "state": "failed", "source": path,
           "destination": path, **counts, "rate_bytes_per_s": 0, "eta_s": None,
           "error": f"no {path}"}  # fmt: skip
    render.status({"job_id": "9", "state": "failed", "error": path, "directives": [row]})
    sys.stdout.flush()
    assert b"/d/r\\xe9s -> /d/r\\xe9s" in out.getvalue()


# --- every byte pattern through the real Lua hooks to a real daemon -------------------------


def hook(d: Daemon, name: str, *args: str | None) -> tuple[int, bytes]:
    """A hook's (rc, message), the message as the bytes Slurm would get."""
    argv = ["nil" if a is None else str(a) for a in args]
    out = subprocess.run(
        [d.lua, str(REPO / "tests" / "lua" / "call_hook.lua"), str(d.etc), name, *argv],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    first, _, rest = out.stdout.partition(b"\n")
    return int(first.removeprefix(b"rc=")), rest.rstrip(b"\n")


NAMES = [b"in.dat", b"r\xe9sultat.dat", b"mon r\xe9sultat.dat", b"\x80\xff\xc3\xa9\xed\xa0\x80.dat"]
MiB = 1 << 20


def cases(src: bytes, out: bytes) -> list[tuple[str, bytes, bytes | None]]:
    """(name, script, expected error message start or None to stage). ``src`` holds NAMES;
    a staging script copies one of them into scratch and back out into ``out``."""

    def stage(name: bytes, quote: bool = False) -> bytes:
        q = b'"' if quote else b""
        return (
            b"#BB_LUA stage_in source=" + q + src + b"/" + name + q
            + b" destination=" + q + b"$BB_SCRATCH/" + name + q + b"\n"
            b"#BB_LUA stage_out source=" + q + b"$BB_SCRATCH/" + name + q
            + b" destination=" + q + out + b"/" + name + q + b"\n"
        )  # fmt: skip

    sh = b"#!/bin/bash\n"
    every = bytes(b for b in range(256) if b != 10)
    odd = b" ".join(ODD)
    big_body = (b"echo r" + E9 + b"sultat " + odd + b"\n") * (4 * MiB // 40)
    maximum = sh + stage(NAMES[1]) + b"./app\n"
    maximum += big_body[: directives.MAX_SCRIPT_BYTES - len(maximum) - 1] + b"\n"
    assert len(maximum) == directives.MAX_SCRIPT_BYTES
    n0, n1, n2, n3 = (stage(n) for n in NAMES)
    s3 = b"#BB_LUA stage_out source=/a destination=s3://bkt/r" + E9 + b"\n"
    return [
        ("latin1-in-comment", sh + b"# r" + E9 + b"sultat\n" + n0 + b"true\n", None),
        ("latin1-in-body", sh + n0 + b"echo r" + E9 + b"sultat\n", None),
        ("latin1-in-path", sh + n1 + b"true\n", None),
        ("latin1-in-quoted-path", sh + stage(NAMES[2], quote=True) + b"true\n", None),
        ("mixed-bytes-in-path", sh + n3 + b"true\n", None),
        ("every-byte-in-comment-and-body", sh + b"#" + every + b"\n" + n0 + every, None),
        ("odd-utf8-in-comment", sh + b"# " + odd + b"\n" + n1 + odd + b"\n", None),
        ("crlf-comments-and-body", b"#!/bin/bash\r\n#x\r\n" + n1 + b"./a\r\n\r\n", None),
        ("nul-in-comment-and-body", sh + b"# a\0b\x1b\x7f\n" + n0 + b"x\0y\n", None),
        ("1MiB-comment-line", sh + b"#" + E9 * MiB + b"\n" + n1, None),
        ("1MiB-body-line", sh + n1 + b"echo " + (b"r" + E9) * (MiB // 2) + b"\n", None),
        ("random-body", sh + n3 + os.urandom(MiB), None),
        ("max-script-size", maximum, None),
        ("crlf-directive", b"#!/bin/bash\r\n" + n0.replace(b"\n", b"\r\n"), b"line 2: "),
        ("1MiB-directive-line", sh + b"#BB_LUA stage_in source=/" + E9 * MiB, b"line 2: "),
        ("over-max-script-size", maximum + b"#", b"script: "),
        ("latin1-in-s3-key", sh + n0 + s3, b"line 4: stage_out: byte 0xe9"),
        ("nul-in-directive", sh + b"#BB_LUA stage_in source=/a\0 destination=/b\n", b"line 2: "),
        ("latin1-verb", sh + b"#BB_LUA r" + E9 + b"s\n", b'line 2: unknown verb "r\xe9s"'),
    ]  # fmt: skip


def test_every_script_gets_an_answer(daemon: Daemon, area: Path) -> None:
    uid, gid = user_ids()
    src, out = area / "src", area / "out"
    src.mkdir()
    out.mkdir()
    for name in NAMES:
        with open(bytes(src) + b"/" + name, "wb") as f:
            f.write(os.urandom(100_000))
    user_tree(src, uid, gid)
    user_tree(out, uid, gid)
    scratch = bytes(area / "daemon" / "scratch")
    all_cases = cases(bytes(src), bytes(out))
    for job_id, (case, text, error) in enumerate(all_cases, start=500):
        path = area / f"{case}.sh"
        path.write_bytes(text)
        path.chmod(0o644)
        checked = hook(daemon, "slurm_bb_job_process", str(path), str(uid), str(gid))
        ids = (str(job_id), str(uid), str(gid))
        rc, message = hook(daemon, "slurm_bb_setup", *ids, "(null)", "0", str(path))
        assert b"bad request" not in message, case
        if error is not None:  # refused at sbatch with its line; setup says the same
            assert checked[0] == -1 and checked[1].startswith(error), (case, checked)
            assert (rc, message) == checked, case
            continue
        assert checked == (0, b""), (case, checked)
        assert (rc, message) == (0, b""), case
        assert hook(daemon, "slurm_bb_data_in", str(job_id), str(path)) == (0, b""), case
        staged = [n for n in NAMES if n in text]
        assert staged, case
        name = max(staged, key=len)  # "mon r\xe9sultat.dat" holds "r\xe9sultat.dat"
        assert file_digest(scratch + b"/%d/" % job_id + name) == file_digest(
            bytes(src) + b"/" + name
        ), case
        assert hook(daemon, "slurm_bb_data_out", str(job_id), str(path)) == (0, b""), case
        assert file_digest(bytes(out) + b"/" + name) == file_digest(bytes(src) + b"/" + name), case
        os.unlink(bytes(out) + b"/" + name)
        status = daemon.cli("status", str(job_id))  # human output: the bytes shown as \xNN
        assert status.returncode == 0, (case, status.stderr)
        assert hook(daemon, "slurm_bb_job_teardown", str(job_id), str(path), "false")[0] == 0
    assert len(all_cases) == 19


# --- the user socket: one user's idle connections cost the others nothing -------------------


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    return sock


def _answered(sock: socket.socket) -> bool:
    """Whether the daemon has written to (or closed) this connection: it is readable."""
    return bool(select.select([sock], [], [], 0)[0])


def _reply(sock: socket.socket, timeout: float) -> dict[str, Any] | None:
    """The daemon's reply line, or None if it closed the connection without one."""
    sock.settimeout(timeout)
    data = client.read_reply(sock)
    return json.loads(data) if data else None


def test_idle_connections_are_capped_per_user(daemon: Daemon, area: Path) -> None:
    path = area / "daemon" / "run" / "user.sock"
    job = area / "job.sh"
    job.write_bytes(b"#!/bin/sh\n#BB_LUA\ntrue\n")
    job.chmod(0o644)
    uid, gid = user_ids()
    opened = time.monotonic()
    idle = [_connect(path) for _ in range(200)]  # root's, never sending a request
    try:
        cap = server.USER_CONNECTIONS_PER_UID
        # Accepted in order: once the last is answered, the daemon holds all of them.
        wait_until(lambda: _answered(idle[-1]), 5, "the answer to the last connection")
        started = time.monotonic()
        over = [_reply(sock, 5) for sock in idle[cap:]]  # answered at once, not held
        assert time.monotonic() - started < 3
        assert all(r is not None and r["status"] == "error" for r in over)
        assert "busy" in over[0]["message"] and "try again" in over[0]["message"]
        started = time.monotonic()
        status = daemon.cli("jobs", "--json", user="bbuser1")  # another user: served promptly
        assert status.returncode == 0, status.stderr
        assert time.monotonic() - started < 5  # a whole CLI process start-up included
        setup = hook(daemon, "slurm_bb_setup", "601", str(uid), str(gid), "(null)", "0", str(job))
        assert setup == (0, b"")  # hooks are another socket: unaffected
        held = [_reply(sock, 15) for sock in idle[:cap]]  # dropped after the read timeout
        assert all(r is not None and r["message"] == "bad request" for r in held)
        assert time.monotonic() - opened < 4  # the CLI sends at once: 2 s is plenty (was 10)
        assert daemon.cli("jobs").returncode == 0  # root is served again
    finally:
        for sock in idle:
            sock.close()
