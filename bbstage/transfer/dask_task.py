"""One transfer on a data-transfer node: the Dask task, and the child process it runs.

``run_attempt`` runs in a thread of a Dask worker, which is root on the node. It never
changes its own identity: it starts ``python -m bbstage.transfer.dask_task`` as a child process that
the kernel starts as the job's user (``Popen(user=, group=, extra_groups=)``, in a new
session), hands it the ``TransferSpec`` on stdin and reads its events back as JSON lines
on stdout (``bbstage.transfer.codec``, strict: a line that is not exactly one known event fails the
attempt). JSON, not pickle: the child runs as the user, who can ptrace it and write
anything to that pipe, and unpickling that in root would give them the node.

Events reach the daemon through the worker's ``log_event`` on the attempt's topic
(``Planned`` at once, ``Moved`` at most every ``FORWARD_EVERY`` s); the outcome is the task's
result, with the ``Planned`` it answers. A set cancel ``distributed.Event``, or the task's
release by the scheduler (the daemon cancelled it or went away), kills the child's
process group (SIGTERM, SIGKILL after ``KILL_AFTER`` s) and removes its temporary files.
The daemon deletes the attempt's two events (``cancel_event``, ``started_event``) once the
attempt's outcome is final there.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from bbstage import movers
from bbstage.identity import Identity, IdentityError, unlink_as, user_env
from bbstage.transfer import (
    Done,
    Event,
    Failed,
    Moved,
    Planned,
    TransferSpec,
    codec,
    track_temps,
    transfer_env,
    walkproc,
)

FORWARD_EVERY = 0.5  # seconds between Moved events sent to the daemon
POLL_EVERY = 0.2  # seconds between checks for a cancel
KILL_AFTER = 1.0  # seconds between SIGTERM and SIGKILL of the child's process group
EXIT_WAIT = 5.0  # seconds a child that closed its output gets to exit


def cancel_event(attempt: str) -> str:
    """The name of the attempt's ``distributed.Event`` the daemon sets to cancel it."""
    return f"bbstage-cancel-{attempt}"


def started_event(attempt: str) -> str:
    """The name of the ``distributed.Event`` the attempt's task sets when it starts (a rerun
    of the task finds it set)."""
    return f"bbstage-started-{attempt}"


def events(attempt: str) -> tuple[str, str]:
    """Both ``distributed.Event`` names of the attempt (the daemon deletes them once it is
    over)."""
    return cancel_event(attempt), started_event(attempt)


# --------------------------------------------------------------------------------------
# The Dask task (root, on the node)
# --------------------------------------------------------------------------------------


def run_attempt(
    attempt: str, spec: TransferSpec, uid: int, gid: int, cancel_name: str
) -> dict[str, Any]:
    """Run one attempt of a transfer as ``uid``/``gid`` in a child process; the outcome
    (``Done`` or ``Failed``), the ``Planned`` it answers, and the node that ran it."""
    from distributed import Event as DaskEvent
    from distributed import get_client, get_worker

    worker = get_worker()
    node = worker.name if isinstance(worker.name, str) else str(worker.address)
    key = worker.get_current_task()
    result: dict[str, Any] = {"node": node, "planned": None, "outcome": None}
    try:
        identity = Identity.of(uid, gid)  # this node's user database: refused if unknown
    except IdentityError as exc:
        result["outcome"] = Failed(f"node {node} refuses the transfer: {exc}")
        return result
    # Bound to the worker's client here, in the task's thread: the watcher's thread has
    # no client of its own to find (is_set would raise there, and the cancel never come).
    client = get_client()
    cancel = DaskEvent(cancel_name, client=client)
    # Dask reruns the task of a worker that died: that run sweeps the temporary files the
    # dead one left (only its shard's), as a resumed transfer does.
    started = DaskEvent(started_event(attempt), client=client)
    if started.is_set():
        spec = spec.but(resumed=True)
    started.set()

    def cancelled() -> bool:
        state = worker.state.tasks.get(key)
        released = state is None or state.state in ("cancelled", "released", "forgotten")
        return released or cancel.is_set()

    def send(event: Event) -> None:
        worker.log_event(attempt, {"node": node, **codec.to_dict(event)})

    worker.log_event(attempt, {"node": node, "started": True})  # the stall watchdog's start
    outcome, planned = run_child(spec, identity, send, cancelled)
    result["planned"], result["outcome"] = planned, outcome
    return result


def run_child(
    spec: TransferSpec,
    identity: Identity,
    send: Any,
    cancelled: Any,
) -> tuple[Done | Failed, Planned | None]:
    """Start the child as ``identity``, feed it ``spec``, forward its events to ``send``
    (``Moved`` coalesced), and kill its process group when ``cancelled()`` says so."""
    # The user's environment (identity.user_env), this bbstage first (walkproc's rule), and
    # the variables the transfer's two backends let it see (proxies): never a credential.
    passed = movers.env_names({spec.source_kind, spec.destination_kind})
    env = user_env(identity.uid, PYTHONPATH=walkproc.own_pythonpath())
    env |= {k: v for k, v in os.environ.items() if k in passed}
    child = subprocess.Popen(
        [sys.executable, "-m", "bbstage.transfer.dask_task", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        user=identity.uid,
        group=identity.gid,
        extra_groups=list(identity.groups),
        umask=0o077,
        start_new_session=True,  # its own process group: a cancel kills every thread of it
        env=env,
        cwd="/",
        close_fds=True,
    )
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(pickle.dumps(spec))
    child.stdin.close()
    stopped = threading.Event()
    finished = threading.Event()
    progress = _Progress(send)

    def watch() -> None:
        while not finished.wait(POLL_EVERY):
            progress.tick()
            try:
                stop = cancelled()
            except Exception as exc:  # the scheduler is unreachable: keep copying, ask again
                print(
                    f"bbstage.transfer.dask_task: cannot check for a cancel: {exc!r}",
                    file=sys.stderr,
                )
                stop = False
            if stop:
                stopped.set()
                kill_group(child)
                return

    watcher = threading.Thread(target=watch, name="bbstage-cancel-watch", daemon=True)
    watcher.start()
    temps: set[str] = set()
    planned: Planned | None = None
    outcome: Done | Failed | None = None
    try:
        while True:
            line = child.stdout.readline(codec.MAX_FRAME + 1)
            if not line:
                break
            try:
                if len(line) > codec.MAX_FRAME:
                    raise codec.CodecError(f"a line over {codec.MAX_FRAME} bytes")
                if not line.endswith(b"\n"):
                    raise codec.CodecError("a line cut short")
                event = codec.decode(line[:-1])
            except codec.CodecError as exc:
                outcome = Failed(f"the transfer process sent a malformed event, refused: {exc}")
                kill_group(child)
                break
            if track_temps(temps, event):
                pass
            elif isinstance(event, Done | Failed):
                outcome = event
            elif isinstance(event, Planned):
                planned = event
                send(event)
            elif isinstance(event, Moved):
                progress.offer(event)
    finally:
        finished.set()
        watcher.join()
        try:
            child.wait(0.01 if stopped.is_set() else EXIT_WAIT)
        except subprocess.TimeoutExpired:
            pass
        kill_group(child)
        child.stdout.close()
    progress.tick(force=True)
    if stopped.is_set():
        outcome = Failed("cancelled", permanent=True)
    elif outcome is None:
        outcome = Failed(f"transfer process exited with code {child.returncode}", permanent=False)
    if not isinstance(outcome, Done):
        _unlink_temps(sorted(temps), identity)
    return outcome, planned


def _unlink_temps(paths: list[str], identity: Identity) -> None:
    """Remove the temporary files of a killed or failed child, as the user."""
    try:
        unlink_as(identity, paths, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"bbstage.transfer.dask_task: temporary files kept: {exc!r}", file=sys.stderr)


class _Progress:
    """``Moved`` events coalesced: one sent at most every ``FORWARD_EVERY`` s, and a held
    one sent by ``tick`` (the watcher's, every ``POLL_EVERY`` s) once it is due."""

    def __init__(self, send: Any) -> None:
        self._send, self._lock = send, threading.Lock()
        self._held: Moved | None = None
        self._sent = 0.0

    def offer(self, event: Moved) -> None:
        with self._lock:
            self._held = event
        self.tick()

    def tick(self, force: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            if self._held is None or (not force and now - self._sent < FORWARD_EVERY):
                return
            event, self._held, self._sent = self._held, None, now
        self._send(event)


def kill_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM the child's process group (the mover removes its partial files), SIGKILL
    whatever is left after ``KILL_AFTER`` s."""
    if child.poll() is not None:
        return
    _killpg(child.pid, signal.SIGTERM)
    try:
        child.wait(KILL_AFTER)
    except subprocess.TimeoutExpired:
        pass
    _killpg(child.pid, signal.SIGKILL)
    child.wait()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------------------
# The child (the job's user)
# --------------------------------------------------------------------------------------


class _Lines:
    """The ``worker.Sink`` the child's reporter writes to: one JSON line per event."""

    def __init__(self) -> None:
        self._out = sys.stdout.buffer

    def send(self, event: Event) -> None:
        for frame in codec.frames(event):
            self._out.write(frame + b"\n")
        self._out.flush()


def _child(parent: int) -> int:
    from bbstage.transfer import worker

    if os.getuid() == 0 or os.geteuid() == 0:
        print("bbstage.transfer.dask_task: refusing to copy as root", file=sys.stderr)
        return 2
    spec = pickle.loads(sys.stdin.buffer.read())  # from root, our parent
    cancel = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())

    def watch() -> None:  # the Dask worker died: stop (the next attempt sweeps temp files)
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()
    transfer_env.remember()
    worker.transfer(spec, worker.Reporter(_Lines()), cancel)
    return 0


if __name__ == "__main__":
    sys.exit(_child(int(sys.argv[1])))
