"""The transfer executor: worker processes per identity, reused, retired, cancelled."""

from __future__ import annotations

import multiprocessing
import os
import pwd
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bbstage.daemon import executor as executor_module
from bbstage.daemon.executor import TransferExecutor
from bbstage.identity import Identity
from bbstage.movers import Cancelled, TransferError
from bbstage.transfer import TransferSpec, worker
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="workers drop from root to a user")

NOBODY = Identity(65534, 65534, (65534,))
DAEMON = Identity(1, 1, (1,))


@pytest.fixture
def executor() -> Iterator[TransferExecutor]:
    ex = TransferExecutor(4)
    yield ex
    ex.shutdown()


def source(area: Path, name: str = "in", data: bytes = b"hello") -> Path:
    path = area / name
    path.write_bytes(data)
    path.chmod(0o644)
    return path


def stage(ex: TransferExecutor, key: str, src: Path, dst: Path, who: Identity = NOBODY) -> None:
    ex.submit(key, TransferSpec.between(str(src), str(dst)), who, lambda event: None).result(
        timeout=60
    )


def test_a_users_worker_is_reused(area: Path, executor: TransferExecutor) -> None:
    src = source(area)
    stage(executor, "1:0", src, area / "out1")
    assert executor.idle == 1
    pid = executor._idle[0].proc.pid
    stage(executor, "2:0", src, area / "out2")
    assert executor.idle == 1 and executor._idle[0].proc.pid == pid
    assert (area / "out2").read_bytes() == b"hello"
    assert (area / "out2").stat().st_uid == NOBODY.uid


def test_each_identity_has_its_own_worker(area: Path, executor: TransferExecutor) -> None:
    src = source(area)
    stage(executor, "1:0", src, area / "a")
    stage(executor, "2:0", src, area / "b", DAEMON)
    assert executor.idle == 2
    assert (area / "a").stat().st_uid == NOBODY.uid
    assert (area / "b").stat().st_uid == DAEMON.uid


def test_a_failed_transfer_retires_its_worker(area: Path, executor: TransferExecutor) -> None:
    with pytest.raises(TransferError, match="no such file or directory"):
        stage(executor, "1:0", area / "missing", area / "out")
    assert executor.idle == 0


def test_idle_workers_are_retired(
    area: Path, executor: TransferExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(executor_module, "IDLE_RETIRE", 0.2)
    stage(executor, "1:0", source(area), area / "out")
    proc = executor._idle[0].proc
    wait_until(lambda: executor.idle == 0, 10, "the idle worker to retire", every=0.1)
    assert executor.idle == 0
    proc.join(5)
    assert not proc.is_alive()


def test_cancel_stops_the_transfer_and_its_worker(area: Path, executor: TransferExecutor) -> None:
    big = area / "big"
    with open(big, "wb") as f:
        f.truncate(8 << 30)  # sparse: copying it still takes seconds
    big.chmod(0o644)
    events: list[tuple[object, ...]] = []
    future = executor.submit(
        "1:0", TransferSpec.between(str(big), str(area / "out")), NOBODY, events.append
    )
    wait_until(lambda: events, 30, "the worker's first event")
    started = time.monotonic()
    executor.cancel("1:0")
    with pytest.raises(Cancelled):
        future.result(timeout=10)
    assert time.monotonic() - started < 2
    assert executor.idle == 0 and executor.running == 0
    assert sorted(p.name for p in area.iterdir()) == ["big"]


def test_shutdown_ends_idle_workers(area: Path) -> None:
    ex = TransferExecutor(2)
    stage(ex, "1:0", source(area), area / "out")
    proc = ex._idle[0].proc
    ex.shutdown()
    proc.join(5)
    assert not proc.is_alive() and ex.idle == 0


def _deaf_to_sigterm(ready: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()  # type: ignore[attr-defined]
    time.sleep(60)


def test_shutdown_stops_stuck_workers_together_not_one_after_another() -> None:
    """Three workers that ignore SIGTERM: one KILL_AFTER for all (was three, in turn)."""
    ex = TransferExecutor(4)
    ctx = multiprocessing.get_context("fork")
    procs = []
    for n in range(3):
        ready = ctx.Event()
        proc = ctx.Process(target=_deaf_to_sigterm, args=(ready,))
        proc.start()
        assert ready.wait(10)
        procs.append(proc)
        parent, _ = ctx.Pipe()
        ex._running[f"{n}:0"] = executor_module._Worker(proc, parent, NOBODY)
    started = time.monotonic()
    ex.shutdown()
    assert time.monotonic() - started < executor_module.KILL_AFTER + 1
    assert not any(p.is_alive() for p in procs)


def test_workers_copy_at_normal_priority_under_a_raised_daemon() -> None:
    import multiprocessing

    from bbstage.transfer import worker

    parent, child = multiprocessing.Pipe(duplex=True)
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, -5)  # as under the unit's Nice=-10
    try:
        proc = multiprocessing.get_context("fork").Process(
            target=worker.serve, args=(child, NOBODY)
        )
        proc.start()
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
    try:
        wait_until(
            lambda: _nice(proc.pid) == 0,  # type: ignore[arg-type]
            10,
            lambda: f"the worker's nice value 0, not {_nice(proc.pid)}",  # type: ignore[arg-type]
        )
    finally:
        parent.send(None)
        proc.join(10)


def _nice(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[16])


def test_a_worker_has_exactly_the_users_groups(area: Path, executor: TransferExecutor) -> None:
    """Supplementary groups are the user's own (setgroups), not root's, and not none."""
    theirs = source(area, "theirs", b"group 1 may read")
    os.chown(theirs, 0, 1)
    theirs.chmod(0o640)
    stage(executor, "1:0", theirs, area / "a", Identity(65534, 65534, (1, 65534)))
    assert (area / "a").read_bytes() == b"group 1 may read"
    others = source(area, "others", b"group 2 only")
    os.chown(others, 0, 2)
    others.chmod(0o640)
    with pytest.raises(TransferError, match="permission denied"):
        stage(executor, "2:0", others, area / "b", Identity(65534, 65534, (1, 65534)))


def test_a_killed_workers_temporary_file_is_removed(area: Path, executor: TransferExecutor) -> None:
    """SIGKILL leaves the worker no chance to clean up: the executor removes its .part file."""
    big = area / "big"
    with open(big, "wb") as f:
        f.truncate(8 << 30)  # sparse: copying it still takes seconds
    big.chmod(0o644)
    future = executor.submit(
        "1:0", TransferSpec.between(str(big), str(area / "out")), NOBODY, lambda event: None
    )
    wait_until(
        lambda: [p for p in area.iterdir() if p.name.endswith(".part")], 30, "a temporary file"
    )
    os.kill(executor._running["1:0"].proc.pid, signal.SIGKILL)
    with pytest.raises(TransferError, match="worker exited"):
        future.result(timeout=10)
    assert sorted(p.name for p in area.iterdir()) == ["big"]


def test_a_worker_drops_roots_aws_variables_and_takes_the_users_home(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Root's AWS_* (keys, container-role URIs) never reach a transfer; HOME is the user's."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "root's")
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://127.0.0.1:9/creds")
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()

    def probe() -> None:
        worker._become(NOBODY)
        child.send((sorted(k for k in os.environ if k.startswith("AWS_")), os.environ["HOME"]))

    proc = ctx.Process(target=probe)
    proc.start()
    assert parent.poll(10)
    assert parent.recv() == ([], pwd.getpwuid(NOBODY.uid).pw_dir)
    proc.join(10)


class _MakesADirectory:
    """A pickle that runs ``os.mkdir(path)`` in whoever unpickles it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, ...]:
        return (os.mkdir, (self.path,))


def _hostile(monkeypatch: pytest.MonkeyPatch, ex: TransferExecutor, answer: object) -> None:
    """Workers of ``ex`` that take the spec and answer ``answer`` (bytes as one raw message,
    else pickled with ``Connection.send``) as a worker the user took over could: forked, so
    the stand-in needs no import in the forkserver."""

    def serve(conn: object, identity: Identity, daemon: int | None = None) -> None:
        conn.recv()  # type: ignore[attr-defined]
        if isinstance(answer, bytes):
            conn.send_bytes(answer)  # type: ignore[attr-defined]
        else:
            conn.send(answer)  # type: ignore[attr-defined]
        time.sleep(0.5)  # root reads it before the pipe closes

    monkeypatch.setattr(ex, "_ctx", multiprocessing.get_context("fork"))
    monkeypatch.setattr(worker, "serve", serve)


def test_a_worker_that_sends_a_pickle_is_refused_and_nothing_is_unpickled(
    area: Path, executor: TransferExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root never unpickles a worker's answer: the crafted object's __reduce__ would create
    a directory in root; the transfer fails, naming the refusal, and nothing is created."""
    made = area / "made-by-root"
    _hostile(monkeypatch, executor, _MakesADirectory(str(made)))
    with pytest.raises(TransferError, match="malformed event, refused: not JSON"):
        stage(executor, "1:0", source(area), area / "out")
    assert not made.exists()
    assert executor.idle == 0


@pytest.mark.parametrize(
    "answer, why",
    [
        (b"x" * ((1 << 20) + 1), "over 1048576 bytes"),
        (b'{"type":"Done","bytes":-1,"files":1}', "-1 is out of range"),
        (b'{"type":"Done","bytes":1,"files":1,"x":0}', "fields of Done"),
        (b'{"type":"Exec","cmd":"id"}', "unknown event type"),
    ],
    ids=["too-long", "negative", "extra-field", "unknown-type"],
)
def test_a_worker_that_sends_anything_but_an_exact_event_fails_its_transfer(
    area: Path, executor: TransferExecutor, monkeypatch: pytest.MonkeyPatch, answer: bytes, why: str
) -> None:
    _hostile(monkeypatch, executor, answer)
    with pytest.raises(TransferError, match=f"malformed event, refused: .*{why}"):
        stage(executor, "1:0", source(area), area / "out")
    assert not (area / "out").exists()


def _pipe_inode(fd: int) -> str:
    return f"pipe:[{os.fstat(fd).st_ino}]"


def test_a_worker_holds_none_of_roots_pipes(area: Path, executor: TransferExecutor) -> None:
    """The forkserver hands each child root's resource-tracker pipe (a line there makes root
    unlink what it names) and the forkserver's alive pipe: a worker closes both first."""
    from multiprocessing import forkserver, resource_tracker

    roots = {
        _pipe_inode(resource_tracker._resource_tracker._fd),  # type: ignore[attr-defined]
        _pipe_inode(forkserver._forkserver._forkserver_alive_fd),  # type: ignore[attr-defined]
    }
    stage(executor, "1:0", source(area), area / "out")
    pid = executor._idle[0].proc.pid
    held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert (area / "out").read_bytes() == b"hello"
    assert not roots & held, f"the worker holds root's {roots & held}"
