"""The codec of the events a worker (the job's user) sends back to root: exact, typed,
bounded; nothing unpickled. The executor's side is in test_executor.py; here the codec
itself and the Dask child's lines (``dask_task.run_child``, no Dask needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bbstage.identity import Identity
from bbstage.transfer import (
    Done,
    Failed,
    Moved,
    Planned,
    TempFile,
    TempsSettled,
    TransferSpec,
    codec,
    dask_task,
)

NOBODY = Identity(65534, 65534, (65534,))

EVENTS = [
    Planned(10, 2, final=False),
    Moved(0, 0),
    TempFile("/a/.b.bbstage-1-ff.part"),
    TempFile("/a/\udcff\udcfe-not-utf8"),  # a file name that is not UTF-8 (surrogateescape)
    TempsSettled(("/a", "/b")),
    Done(codec.MAX_INT, 1),
    Failed("no such file or directory: /x\nwith a newline", permanent=False),
]


@pytest.mark.parametrize("event", EVENTS)
def test_every_event_comes_back_as_it_went(event: object) -> None:
    (frame,) = codec.frames(event)  # type: ignore[arg-type]
    assert b"\n" not in frame  # one JSON line (the Dask child's pipe)
    assert codec.decode(frame) == event
    assert codec.from_dict(codec.to_dict(event)) == event  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "frame, why",
    [
        (b'{"type":"Done","bytes":"1","files":1}', "str where"),
        (b'{"type":"Done","bytes":true,"files":1}', "bool where"),
        (b'{"type":"Done","bytes":1.0,"files":1}', "float where"),
        (b'{"type":"Done","bytes":-1,"files":1}', "-1 is out of range"),
        (b'{"type":"Done","bytes":9223372036854775808,"files":1}', "out of range"),
        (b'{"type":"Done","bytes":1,"files":1,"extra":0}', "fields of Done"),
        (b'{"type":"Done","bytes":1}', "fields of Done"),
        (b'{"type":"Exec","cmd":"id"}', "unknown event type"),
        (b'{"type":"AttemptUpdate","id":"x","shard":0,"shards":1}', "unknown event type"),
        (b'["Done",1,1]', "not an object"),
        (b'{"type":"TempFile","path":"/a\\u0000b"}', "NUL"),
        (b'{"type":"TempsSettled","paths":["/a",1]}', "int where"),
        (b'{"type":"TempsSettled","paths":"/a"}', "str where"),
        (b"\x80\x04\x95", "not JSON"),  # a pickle's first bytes
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # too deep to parse
    ],
    ids=[
        "str",
        "bool",
        "float",
        "negative",
        "over-2**63",
        "extra-field",
        "missing-field",
        "unknown-type",
        "not-a-worker-event",
        "list",
        "nul-in-path",
        "int-in-paths",
        "str-for-paths",
        "pickle",
        "too-deep",
    ],
)
def test_anything_but_an_exact_typed_event_is_refused(frame: bytes, why: str) -> None:
    with pytest.raises(codec.CodecError, match=why):
        codec.decode(frame)


def test_a_long_event_is_sent_in_frames_within_the_bound() -> None:
    paths = tuple(f"/d/{'x' * 4000}{i}" for i in range(1024))
    frames = list(codec.frames(TempsSettled(paths)))
    assert len(frames) > 1 and all(len(f) <= codec.MAX_FRAME for f in frames)
    assert sum((codec.decode(f).paths for f in frames), ()) == paths  # type: ignore[union-attr]
    (cut,) = codec.frames(Failed("\0" * codec.MAX_FRAME))
    assert len(cut) <= codec.MAX_FRAME
    assert codec.decode(cut).message.endswith(" [cut]")  # type: ignore[union-attr]


def _fake_child(area: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """``dask_task.run_child`` starts this shell script (as the user) instead of
    ``python -m bbstage.transfer.dask_task``: a child the user took over."""
    path = area / "child"
    path.write_text(f"#!/bin/sh\ncat >/dev/null\n{script}\n")
    path.chmod(0o755)
    monkeypatch.setattr(dask_task.sys, "executable", str(path))


@pytest.mark.skipif(os.geteuid() != 0, reason="the child drops from root to a user")
@pytest.mark.parametrize(
    "script, why",
    [
        ("printf '\\200\\004\\225pickle\\n'", "not JSON"),
        ('printf \'%s\\n\' \'{"type":"Done","bytes":1,"files":1,"x":1}\'', "fields of Done"),
        ("head -c 2000000 /dev/zero | tr '\\0' x; echo", "a line over 1048576 bytes"),
        ('printf \'%s\' \'{"type":"Done","bytes":1,"files":1}\'', "a line cut short"),
    ],
    ids=["pickle", "extra-field", "long-line", "cut-short"],
)
def test_a_dask_child_that_sends_anything_but_exact_events_fails_its_attempt(
    area: Path, monkeypatch: pytest.MonkeyPatch, script: str, why: str
) -> None:
    _fake_child(area, monkeypatch, script)
    sent: list[object] = []
    outcome, planned = dask_task.run_child(
        TransferSpec.between(str(area / "in"), str(area / "out")),
        NOBODY,
        sent.append,
        lambda: False,
    )
    assert isinstance(outcome, Failed), outcome
    assert "malformed event, refused: " in outcome.message and why in outcome.message
    assert planned is None and sent == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the child drops from root to a user")
def test_root_reads_at_most_one_frame_of_a_line_that_never_ends(
    area: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 MB without a newline: root stops reading after 1 MiB and ends the child, which is
    still writing (it would touch a file had root read everything, to its end)."""
    _fake_child(
        area,
        monkeypatch,
        'head -c 8000000 /dev/zero | tr \'\\0\' x; touch "$(dirname "$0")/read-to-the-end"',
    )
    outcome, _ = dask_task.run_child(
        TransferSpec.between(str(area / "in"), str(area / "out")),
        NOBODY,
        lambda event: None,
        lambda: False,
    )
    assert isinstance(outcome, Failed) and "a line over 1048576 bytes" in outcome.message
    assert not (area / "read-to-the-end").exists()


class _Trap:
    """A pickle whose loading makes a directory: proof that it was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (self.path,))


@pytest.mark.parametrize("sends", ["pickle", "run-pickle", "run-extra-field", "run-other-job"])
def test_bench_as_user_never_unpickles_what_its_child_sends(
    sends: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bbstage bench --as-user``: root reads its child (the user) as JSON arrays only; a
    pickle, or a relayed transfer that is not exactly the directive's fields, is refused and
    nothing of it runs in root."""
    from multiprocessing.connection import Connection

    from bbstage import config
    from bbstage.bench import run
    from bbstage.bench.model import BenchError, Options

    trap = tmp_path / "unpickled-in-root"
    fields = {"job_id": "bench-1", "source": "/a", "destination": "/b", "source_kind": "posix",
              "destination_kind": "posix", "tree": False, "glob": False, "checksum": "none",
              "overwrite": "always", "profile": None}  # fmt: skip
    messages = {
        "pickle": lambda conn: conn.send(("ok", _Trap(str(trap)))),
        "run-pickle": lambda conn: conn.send(("run", _Trap(str(trap)))),
        "run-extra-field": lambda conn: run._send(conn, "run", fields | {"shard": 1}),
        "run-other-job": lambda conn: run._send(conn, "run", fields | {"job_id": "42"}),
    }

    def hostile(conn: Connection, opts: Options, identity: Identity) -> None:
        messages[sends](conn)
        conn.close()

    monkeypatch.setattr(run, "_child", hostile)
    opts = Options(source="/a", destination="/b", plan=[], config=config.Config())
    relayed: list[TransferSpec] = []
    with pytest.raises(BenchError, match="refused|bad|another job"):
        run.bench_as(opts, "nobody", runner=lambda spec, *_: relayed.append(spec))
    assert not trap.exists() and relayed == []
