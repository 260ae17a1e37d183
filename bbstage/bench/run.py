"""Run the benchmark here, or in a child process that has become another user first, as
the daemon's workers do (so the user's permissions and quotas apply)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pwd
import threading
from multiprocessing.connection import Connection
from typing import Any

from bbstage import movers, worker
from bbstage.bench.model import BenchError, Location, Options
from bbstage.bench.posix import bench_posix
from bbstage.bench.s3 import bench_s3
from bbstage.bench.transfer import DaskRunner
from bbstage.identity import Identity
from bbstage.transfer import Done, Moved, TransferSpec


def bench(opts: Options) -> dict[str, Any]:
    """Generate, stage (and time the baselines), clean up; return the result dict."""
    src, dst = Location(opts.source), Location(opts.destination)
    if src.kind == "s3" or dst.kind == "s3":
        return bench_s3(opts, src, dst)
    return bench_posix(opts, src, dst)


def bench_as(opts: Options, user: str, runner: Any = None) -> dict[str, Any]:
    """Run :func:`bench` in a child process that has become ``user`` (as a worker does).
    With ``runner`` (root's: a ``DaskRunner``), the child's timed transfers run through it,
    here, relayed over the pipe (``Relay``); the rest (data set, baselines, clean-up) stays
    the user's."""
    identity = _identity(user)
    if os.geteuid() != 0:
        raise BenchError("--as-user needs root")
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    if runner is not None:
        opts = dataclasses.replace(opts, runner=Relay(child))
    proc = ctx.Process(target=_child, args=(child, opts, identity))
    proc.start()
    child.close()
    try:
        while (outcome := parent.recv())[0] == "run":
            _serve(parent, runner, outcome[1])
    except EOFError:
        outcome = ("error", f"the benchmark process died (exit code {proc.exitcode})")
    proc.join()
    if outcome[0] == "error":
        raise BenchError(outcome[1])
    return outcome[1]  # type: ignore[no-any-return]


def bench_dask(opts: Options, user: str | None, client: Any = None) -> dict[str, Any]:
    """:func:`bench_as` ``user``, with our timed transfers run on the configured Dask
    cluster as the daemon runs a job's (``[movers]``: scheduler and certificates, which
    only root holds), the nodes copying as ``user``; the baselines copy on this host.
    ``client``: tests."""
    if not user:
        raise BenchError("--executor dask needs --as-user USER: the nodes copy as that user")
    if os.geteuid() != 0:
        raise BenchError("--executor dask needs root (the Dask client certificate is root's)")
    movers_conf = opts.config.movers
    if client is None and not (movers_conf.scheduler and movers_conf.tls_cert):
        raise BenchError(
            "--executor dask: no Dask cluster in the configuration: set [movers] scheduler,"
            " tls_ca_file, tls_cert and tls_key (docs/scale-out.md)"
        )
    runner = DaskRunner(movers_conf, _identity(user), client)
    try:
        out = bench_as(opts, user, runner)
    finally:
        runner.close()
    out["engine"] = {"name": "dask", "scheduler": movers_conf.scheduler,
                     "nodes": sorted(runner.nodes)}  # fmt: skip
    return out


def _identity(user: str) -> Identity:
    """``user``'s uid, gid and groups; a BenchError naming ``--as-user`` if unknown."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise BenchError(f"--as-user {user}: no such user") from None
    return Identity.of(pw.pw_uid, pw.pw_gid)


class Relay:
    """The runner of :func:`bench_as`'s child: hands each transfer to the parent's runner
    and follows its progress (the child is the user: it cannot reach the Dask cluster)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def __call__(self, spec: TransferSpec, reporter: Any, cancel: threading.Event) -> None:
        self._conn.send(("run", spec))
        while True:
            msg = self._conn.recv()
            if msg[0] == "moved":
                reporter.moved(Moved(msg[1], msg[2]))
            elif msg[0] == "end":
                return
            else:
                raise movers.TransferError(msg[1], permanent=msg[2])


class _Forward:
    """The parent's reporter for a relayed transfer: progress back to the child."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def moved(self, event: Moved | Done) -> None:
        self._conn.send(("moved", event.bytes, event.files))

    def send(self, event: Any) -> None:
        pass  # the plan: the child checks the counts itself


def _serve(conn: Connection, runner: Any, spec: TransferSpec) -> None:
    """Run one relayed transfer; its end (or error) back to the child."""
    try:
        runner(spec, _Forward(conn), threading.Event())
    except movers.TransferError as exc:
        conn.send(("error", str(exc), exc.permanent))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}", True))
    else:
        conn.send(("end",))


def _child(conn: Connection, opts: Options, identity: Identity) -> None:
    try:
        worker._become(identity)
        os.umask(0o022)
        if opts.cache == "auto":
            opts.cache = "warm"  # the user cannot drop caches
        conn.send(("ok", bench(opts)))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}" if not _ours(exc) else str(exc)))
    finally:
        conn.close()


def _ours(exc: Exception) -> bool:
    return isinstance(exc, BenchError | movers.TransferError)
