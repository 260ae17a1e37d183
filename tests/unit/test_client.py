"""bbstage.client and bbstage.api's wait: a daemon that goes away mid-request."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bbstage import api, client


def _serve(path: Path, replies: list[bytes | None]) -> threading.Thread:
    """A stand-in daemon on ``path``: one request per connection, each answered by the next
    of ``replies`` (None: the request is read, then the connection closed with no answer, as
    a daemon killed or stopping leaves it)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()

    def run() -> None:
        with listener:
            for reply in replies:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(65536)
                    if reply is not None:
                        conn.sendall(reply)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "user.sock"


def _ok(result: object) -> bytes:
    return json.dumps({"status": "ok", "result": result}).encode() + b"\n"


def test_a_daemon_that_reads_the_request_and_closes_is_unreachable_not_a_failure(
    sock: Path,
) -> None:
    _serve(sock, [None])
    with pytest.raises(client.Unreachable, match="closed the connection without answering"):
        client.call(sock, "ping")


def test_wait_rides_out_a_daemon_killed_while_it_asked(sock: Path) -> None:
    """The job's ``bbstage wait`` asks the status; the daemon is killed after reading it (no
    reply) and started again: wait asks again and sees the copy done (exit 0), not a failure."""
    row = {"index": 0, "id": "7:0", "kind": "copy", "state": "done", "error": ""}
    served = _serve(sock, [None, _ok({"directives": [row]})])
    waiter = api.Client.__new__(api.Client)
    waiter.target, waiter._job_id = client.Target(socket=sock), "7"
    assert waiter.wait(["7:0"], timeout=30, interval=0.01) == [row]
    served.join(5)
