"""Tests of lua/bbstage/zmtp.lua (pure-Lua ZMTP 3.0 REQ client).

The Lua client runs under every Lua a Slurm may link (``lua5.1`` … ``lua5.4``, tests/luas.py)
through the driver scripts in ``tests/lua/`` and
talks to a real pyzmq ROUTER (or, for the protocol-level cases, to a hand-written
ZMTP peer on a raw Unix socket) bound in ``tmp_path``.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from .helpers import digest
from .luas import lua_fixture

REPO = Path(__file__).resolve().parent.parent
LUA_DIR = REPO / "lua"
REQUEST_LUA = REPO / "tests" / "lua" / "zmtp_request.lua"
LOOP_LUA = REPO / "tests" / "lua" / "zmtp_loop.lua"

lua = lua_fixture()  # every test under lua5.1 ... lua5.4; a missing one fails


# --------------------------------------------------------------------------- helpers


class Result:
    def __init__(self, proc: subprocess.CompletedProcess[str], wall: float) -> None:
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.wall = wall
        self.frames: list[bytes] | None = None
        self.kind: str | None = None
        self.message: str | None = None
        self.elapsed: float | None = None
        for line in proc.stdout.splitlines():
            word, _, rest = line.partition(" ")
            if word == "ok":
                self.frames = []
            elif word == "frame":
                assert self.frames is not None
                size, _, data = rest.partition(" ")
                frame = bytes.fromhex(data)
                assert len(frame) == int(size)
                self.frames.append(frame)
            elif word == "error":
                self.kind, _, self.message = rest.partition(" ")
            elif word == "elapsed":
                self.elapsed = float(rest)


def lua_request(lua: str, sock: Path, frames: list[str], timeout: float = 5.0) -> Result:
    """Run one zmtp.request() in a fresh ``lua`` process."""
    cmd = [lua, str(REQUEST_LUA), str(LUA_DIR), str(sock), str(timeout), *frames]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30)
    res = Result(proc, time.monotonic() - t0)
    assert proc.stderr == "", proc.stderr
    assert res.elapsed is not None, proc.stdout
    return res


class Router:
    """A pyzmq ROUTER on ipc://<path> served by ``handler(sock, frames)`` in a thread.

    ``frames`` is the full multipart message: identity, empty delimiter, payload...
    The handler replies (or not) itself and may replace ``self.sock`` (restart).
    """

    def __init__(self, path: Path, handler: Callable[[Router, list[bytes]], None]) -> None:
        self.path = path
        self.handler = handler
        self.ctx = zmq.Context()
        self.sock = self.bind()
        self.received: list[list[bytes]] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def bind(self) -> zmq.Socket:
        s = self.ctx.socket(zmq.ROUTER)
        s.linger = 0
        s.bind(f"ipc://{self.path}")
        return s

    def reply(self, request: list[bytes], *frames: bytes) -> None:
        self.sock.send_multipart([request[0], b"", *frames])

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.sock.poll(50):
                    msg = self.sock.recv_multipart()
                    self.received.append(msg)
                    self.handler(self, msg)
        except BaseException as exc:  # surfaced by close()
            self.errors.append(exc)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sock.close(0)
        self.ctx.term()
        assert not self.errors, self.errors


def echo(router: Router, msg: list[bytes]) -> None:
    """Reply ok + the payload frames joined by '|'."""
    router.reply(msg, b"ok", b"|".join(msg[2:]))


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    return tmp_path / "control.sock"


# ------------------------------------------------------------------ real ROUTER cases


def test_round_trip_short_frames(lua: str, sock_path: Path) -> None:
    r = Router(sock_path, echo)
    try:
        res = lua_request(lua, sock_path, ['{"v":1,"op":"get_status"}', "second"])
    finally:
        r.close()
    assert res.returncode == 0, res.stdout
    assert res.frames == [b"ok", b'{"v":1,"op":"get_status"}|second']
    # identity, the REQ empty delimiter, then our two frames
    assert r.received[0][1:] == [b"", b'{"v":1,"op":"get_status"}', b"second"]


def test_long_frames_both_directions(lua: str, sock_path: Path, tmp_path: Path) -> None:
    big = os.urandom(5 * 1024 * 1024)
    big_file = tmp_path / "big.bin"
    big_file.write_bytes(big)
    message = bytes(range(256)) + b"x" * 44  # 300 bytes, every byte value

    def handler(router: Router, msg: list[bytes]) -> None:
        ok = msg[1:] == [b"", big]
        router.reply(msg, b"ok" if ok else b"error", message if ok else b"bad payload")

    r = Router(sock_path, handler)
    try:
        res = lua_request(lua, sock_path, [f"@{big_file}"], timeout=20)
    finally:
        r.close()
    assert res.returncode == 0, res.stdout[:500]
    assert res.frames == [b"ok", message]
    assert digest(r.received[0][2]) == digest(big)


def test_empty_frame(lua: str, sock_path: Path) -> None:
    r = Router(sock_path, lambda router, msg: router.reply(msg, b"ok", b""))
    try:
        res = lua_request(lua, sock_path, [""])
    finally:
        r.close()
    assert res.returncode == 0, res.stdout
    assert res.frames == [b"ok", b""]
    assert r.received[0][1:] == [b"", b""]


def test_no_socket_file_is_unreachable_at_once(lua: str, sock_path: Path) -> None:
    res = lua_request(lua, sock_path, ["hello"], timeout=10)
    assert res.returncode == 1
    assert res.kind == "unreachable"
    assert str(sock_path) in (res.message or "")
    assert res.elapsed is not None and res.elapsed < 0.5
    assert res.wall < 5  # process start included, still nowhere near the 10 s deadline


def test_socket_file_without_listener_is_unreachable(lua: str, sock_path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sock_path))  # creates the file; never listen()
    s.close()
    assert sock_path.exists()
    res = lua_request(lua, sock_path, ["hello"], timeout=10)
    assert res.kind == "unreachable", res.stdout
    assert str(sock_path) in (res.message or "")
    assert "refused" in (res.message or "")
    assert res.elapsed is not None and res.elapsed < 0.5


def test_daemon_restart_while_waiting_is_retried(lua: str, sock_path: Path) -> None:
    def handler(router: Router, msg: list[bytes]) -> None:
        if len(router.received) == 1:  # first request: "crash" and come back later
            router.sock.close(0)
            time.sleep(0.5)  # the outage the client must ride out (checked below), not a wait
            router.sock = router.bind()
        else:
            echo(router, msg)

    r = Router(sock_path, handler)
    try:
        res = lua_request(lua, sock_path, ["idempotent request"], timeout=10)
    finally:
        r.close()
    assert res.returncode == 0, res.stdout
    assert res.frames == [b"ok", b"idempotent request"]
    assert [m[1:] for m in r.received] == [[b"", b"idempotent request"]] * 2
    assert res.elapsed is not None and 0.4 < res.elapsed < 5


def test_daemon_gone_for_good_times_out(lua: str, sock_path: Path) -> None:
    def handler(router: Router, msg: list[bytes]) -> None:
        router.sock.close(0)
        router.sock = router.ctx.socket(zmq.ROUTER)  # unbound: poll() never fires

    r = Router(sock_path, handler)
    try:
        res = lua_request(lua, sock_path, ["hello"], timeout=1.5)
    finally:
        r.close()
    assert res.kind == "timeout", res.stdout
    assert res.elapsed is not None and 1.4 < res.elapsed < 2.0


def test_never_answering_daemon_times_out_at_deadline(lua: str, sock_path: Path) -> None:
    r = Router(sock_path, lambda router, msg: None)
    try:
        res = lua_request(lua, sock_path, ["hello"], timeout=1.0)
    finally:
        r.close()
    assert res.returncode == 1
    assert res.kind == "timeout", res.stdout
    assert str(sock_path) in (res.message or "")
    assert res.elapsed is not None and 0.95 <= res.elapsed < 1.3
    assert len(r.received) == 1  # sent once, not re-sent on a mere timeout


def test_many_sequential_requests(lua: str, sock_path: Path) -> None:
    n = 1000
    r = Router(sock_path, echo)
    try:
        cmd = [lua, str(LOOP_LUA), str(LUA_DIR), str(sock_path), str(n)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        r.close()
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == n
    times = []
    for i, line in enumerate(lines, 1):
        idx, dt, status, message = line.split(" ", 3)
        assert (int(idx), status, message) == (i, "ok", f"req {i}")
        times.append(float(dt))
    assert len(r.received) == n
    print(f"\nzmtp.lua: {n} requests, mean {sum(times) / n * 1e3:.3f} ms per request")


# ------------------------------------------------- hand-written ZMTP peer (raw socket)

NULL_GREETING = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32


def frame(flags: int, body: bytes) -> bytes:
    if len(body) > 255:
        return bytes([flags | 2]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def command(name: bytes, body: bytes = b"") -> bytes:
    return frame(4, bytes([len(name)]) + name + body)


READY_ROUTER = command(b"READY", b"\x0bSocket-Type" + struct.pack(">I", 6) + b"ROUTER")


def recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def recv_frame(conn: socket.socket) -> tuple[int, bytes]:
    flags, size = recv_exact(conn, 2)
    if flags & 2:
        size = struct.unpack(">Q", bytes([size]) + recv_exact(conn, 7))[0]
    return flags, recv_exact(conn, size)


def send_trickle(conn: socket.socket, data: bytes) -> None:
    """Send byte by byte with pauses, so the client sees every read fragmented."""
    for i in range(len(data)):
        conn.sendall(data[i : i + 1])
        time.sleep(0.0005)


class FakePeer:
    """Accepts one connection on a raw Unix socket and runs ``script(conn)``."""

    def __init__(self, path: Path, script: Callable[[socket.socket], None]) -> None:
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(str(path))
        self.srv.listen(1)
        self.script = script
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            conn, _ = self.srv.accept()
            with conn:
                self.script(conn)
        except BaseException as exc:
            self.errors.append(exc)

    def close(self) -> None:
        self.thread.join(10)
        self.srv.close()
        assert not self.errors, self.errors


def test_fragmented_handshake_and_long_reply(lua: str, sock_path: Path) -> None:
    seen: dict[str, object] = {}
    long_message = b"m" * 700

    def script(conn: socket.socket) -> None:
        seen["greeting"] = recv_exact(conn, 64)
        send_trickle(conn, NULL_GREETING)
        flags, body = recv_frame(conn)
        seen["ready"] = (flags, body)
        # The client must not send message frames before it has our READY: nothing may arrive
        # in a window of 0.2 s (a wait for a condition cannot show that nothing comes).
        time.sleep(0.2)
        conn.setblocking(False)
        try:
            seen["early"] = conn.recv(65536)
        except BlockingIOError:
            seen["early"] = b""
        conn.setblocking(True)
        send_trickle(conn, READY_ROUTER)
        msg = []
        while True:
            flags, body = recv_frame(conn)
            msg.append(body)
            if not flags & 1:
                break
        seen["msg"] = msg
        send_trickle(conn, frame(1, b"") + frame(1, b"ok") + frame(0, long_message))

    peer = FakePeer(sock_path, script)
    try:
        res = lua_request(lua, sock_path, ["hello"])
    finally:
        peer.close()
    assert res.returncode == 0, res.stdout
    assert res.frames == [b"ok", long_message]
    greeting = seen["greeting"]
    assert isinstance(greeting, bytes) and len(greeting) == 64
    assert greeting[:12] == b"\xff" + b"\0" * 8 + b"\x7f\x03\x00"
    assert greeting[12:32] == b"NULL".ljust(20, b"\0") and greeting[32] == 0
    assert seen["ready"] == (4, b"\x05READY\x0bSocket-Type\x00\x00\x00\x03REQ")
    assert seen["early"] == b""
    assert seen["msg"] == [b"", b"hello"]


def until_closed(conn: socket.socket) -> None:
    """Read until the client hangs up: it must find its error in what it was sent, not in a
    connection the peer closed first."""
    conn.settimeout(10)  # beyond the client's own 5 s
    while conn.recv(65536):
        pass


def _handshake(conn: socket.socket) -> None:
    recv_exact(conn, 64)
    conn.sendall(NULL_GREETING)
    recv_frame(conn)


@pytest.mark.parametrize(
    ("script", "expect"),
    [
        (lambda c: (recv_exact(c, 64), c.sendall(b"HTTP/1.1 400 Bad Request\r\n" * 3)), "ZMTP"),
        (
            lambda c: (
                _handshake(c),
                c.sendall(command(b"ERROR", b"\x0fno such service")),
            ),
            "no such service",
        ),
        (
            lambda c: (
                _handshake(c),
                c.sendall(READY_ROUTER),
                recv_frame(c),
                recv_frame(c),
                c.sendall(frame(1, b"ok") + frame(0, b"")),  # no empty delimiter
            ),
            "delimiter",
        ),
    ],
    ids=["not-zmtp", "error-command", "no-delimiter"],
)
def test_protocol_violations(lua: str, sock_path: Path, script: Callable, expect: str) -> None:
    peer = FakePeer(sock_path, lambda conn: (script(conn), until_closed(conn)))
    try:
        res = lua_request(lua, sock_path, ["hello"], timeout=5)
    finally:
        peer.close()
    assert res.kind == "protocol", res.stdout
    assert expect in (res.message or "")
    assert res.elapsed is not None and res.elapsed < 2
