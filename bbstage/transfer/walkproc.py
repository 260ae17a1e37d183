"""A POSIX tree walked in a process of its own (``WalkApart``), beside the copy.

Walked by a thread, every ``lstat``, ``mkdir`` and read-ahead hint of the walk hands the GIL
to and from the copying thread; in a process of its own the walk runs while the copy copies,
on both CPUs. The process is a fresh interpreter (``python -m bbstage.transfer.walkproc``, started
by the worker, so with the user's identity), not a fork of the worker, whose pages its RSS
would count a second time. Over its stdin and stdout, in frames (length, kind, body):

* in: the ``WalkRequest`` (``pickle``), then one byte per chunk the copy has taken: a credit, so
  the walk stays as far ahead of the copy as a thread's would (``planning.WINDOWS``);
* out: ``C`` a chunk of the plan (``marshal``\\ ed tuples), ``P`` the counts (``Planned``),
  ``E`` the walk's error (message, permanent), ``.`` the end.

It dies with the copy: its stdin closes and it exits, and ``WalkApart.__exit__`` kills it."""

from __future__ import annotations

import marshal
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

from bbstage import movers
from bbstage.identity import user_env
from bbstage.movers import FileTask, Mover, MoverOptions, TransferError, retrying
from bbstage.transfer import FileRange, Planned, TransferSpec, planning

COMMAND = [sys.executable, "-s", "-m", "bbstage.transfer.walkproc"]  # the walk's process
_HOME = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # where bbstage is
MANY = 2_000  # entries: a smaller tree is walked by a thread (a process takes ~0.1 s to start)
_OWED = planning.WINDOWS - 2  # chunks the walk may hand on that the copy has not taken


@dataclass(frozen=True)
class WalkRequest:
    """What the walk's process walks: ``spec``'s plan, as the worker would select it."""

    spec: TransferSpec
    options: MoverOptions
    budget: int | None  # bytes the plan may reach (``planning.Walk``)
    files_ahead: int
    bytes_ahead: int


def wanted(mover: Mover, spec: TransferSpec) -> bool:
    """Walk ``spec`` apart? A mover that asks (``Mover.walk_apart``), a whole tree (not a
    glob, not a share of one file) of more than ``MANY`` entries."""
    if not (mover.walk_apart and spec.tree and not spec.glob):
        return False
    if isinstance(spec.part, FileRange):
        return False
    return _more_than(spec.source, MANY)


def _more_than(root: str, limit: int) -> bool:
    """Does the tree at ``root`` hold more than ``limit`` entries? (No ``stat``: the types
    come with the directory entries.)"""
    try:
        return any(seen > limit for seen, _ in enumerate(planning.entries(root), 1))
    except OSError:
        return False  # the walk will meet it and say so


class WalkApart:
    """The worker's side: a ``planning.Walk`` whose walk runs in the walk's process."""

    def __init__(self, request: WalkRequest, send: Callable[[Planned], None]) -> None:
        self.request, self.send = request, send

    def __enter__(self) -> WalkApart:
        self.proc = subprocess.Popen(
            COMMAND,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=user_env(os.getuid(), PYTHONPATH=own_pythonpath()),
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._credits, self._in = self.proc.stdin, self.proc.stdout
        try:
            _write(self._credits, b"R", pickle.dumps(self.request))
        except BrokenPipeError:
            pass  # it died at once: chunks() says so
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()  # an ended process is not yet reaped: no error
        self.proc.wait()
        for stream in (self._credits, self._in):
            try:
                stream.close()
            except BrokenPipeError:
                pass

    def chunks(self) -> Iterator[list[FileTask]]:
        """The chunks in plan order; raises the walk's error where it happened."""
        while True:
            kind, body = _read(self._in)
            if kind == b"C":
                try:
                    self._credits.write(b"+")  # taken: the walk may go one chunk further
                    self._credits.flush()
                except BrokenPipeError:
                    pass  # the walk has ended
                yield [FileTask(*row) for row in marshal.loads(body)]
            elif kind == b"P":
                self.send(Planned(*marshal.loads(body)))
            elif kind == b"E":
                message, permanent = marshal.loads(body)
                raise TransferError(message, permanent=permanent)
            elif kind == b".":
                return
            else:  # the process died (killed?) before the end
                raise TransferError("the walk of the source ended early", permanent=False)


def own_pythonpath() -> str:
    """The worker's own bbstage first (not another install's), then what the worker had."""
    return os.pathsep.join(filter(None, [_HOME, os.environ.get("PYTHONPATH")]))


class _Sending(planning.Walk):
    """The walk's process's side: ``planning.Walk.walk``, handing chunks to stdout."""

    def __init__(self, request: WalkRequest, out: IO[bytes], credits: IO[bytes]) -> None:
        spec, cancel = request.spec, threading.Event()
        mover = movers.get(spec.source_kind, spec.destination_kind)(request.options)
        chosen = planning.chosen(mover, planning.plan(mover, spec, cancel), spec)

        def make_dir(task: FileTask) -> None:
            retrying.FILE.run(lambda: mover.copy(task, _NO_PROGRESS, cancel), cancel)

        super().__init__(
            mover,
            chosen,
            self._planned,
            cancel,
            make_dir=make_dir,
            budget=request.budget,
            files_ahead=request.files_ahead,
            bytes_ahead=request.bytes_ahead,
        )
        self.out, self.credits, self.owed = out, credits, 0

    def hand_on(self, chunk: list[FileTask] | None, force: bool = False) -> bool:
        while self.owed >= _OWED:
            taken = len(self.credits.read1(planning.WINDOWS))
            if not taken:  # the copy is gone
                return False
            self.owed -= taken
        rows = [(t.src, t.dst, t.kind, t.size, t.mode, t.mtime_ns, t.target) for t in chunk or ()]
        _write(self.out, b"C", marshal.dumps(rows))
        self.owed += 1
        return True

    def _planned(self, planned: Planned) -> None:
        counts = (planned.bytes, planned.files, planned.final, planned.skipped)
        _write(self.out, b"P", marshal.dumps(counts))


class _NoProgress:
    """Making a directory reports nothing."""

    def add(self, nbytes: int) -> None:
        pass

    def temp(self, path: str) -> None:
        pass


_NO_PROGRESS = _NoProgress()


def _write(stream: IO[bytes], kind: bytes, body: bytes) -> None:
    stream.write(len(body).to_bytes(4, "little") + kind + body)
    stream.flush()


def _read(stream: IO[bytes]) -> tuple[bytes, bytes]:
    """One frame's kind and body; kind ``b""`` at the end of the stream (cut short)."""
    head = stream.read(5)
    if len(head) < 5:
        return b"", b""
    size = int.from_bytes(head[:4], "little")
    body = stream.read(size)
    return (head[4:], body) if len(body) == size else (b"", b"")


def main() -> None:
    """The walk's process: read the request, walk, hand the plan on, end with ``.``."""
    credits, out = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever else is printed must not land among the frames
    kind, body = _read(credits)
    if kind != b"R":
        sys.exit(1)
    try:
        try:
            _Sending(pickle.loads(body), out, credits).walk()
        except BrokenPipeError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the copy
            err = exc if isinstance(exc, TransferError) else None
            message = str(exc) if err else f"{type(exc).__name__}: {exc}"
            _write(out, b"E", marshal.dumps((message, err.permanent if err else True)))
        _write(out, b".", b"")
    except BrokenPipeError:
        pass  # the copy is gone


if __name__ == "__main__":
    main()
