"""Run the benchmark here, or in a child process that has become another user first, as
the daemon's workers do (so the user's permissions and quotas apply)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pwd
from multiprocessing.connection import Connection
from typing import Any

from bbstage import movers, worker
from bbstage.bench.model import BenchError, Location, Options
from bbstage.bench.posix import bench_posix
from bbstage.bench.s3 import bench_s3
from bbstage.bench.transfer import DaskRunner
from bbstage.identity import Identity


def bench(opts: Options) -> dict[str, Any]:
    """Generate, stage (and time the baselines), clean up; return the result dict."""
    src, dst = Location(opts.source), Location(opts.destination)
    if src.kind == "s3" or dst.kind == "s3":
        return bench_s3(opts, src, dst)
    return bench_posix(opts, src, dst)


def bench_as(opts: Options, user: str) -> dict[str, Any]:
    """Run :func:`bench` in a child process that has become ``user`` (as a worker does)."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise BenchError(f"--as-user {user}: no such user") from None
    if os.geteuid() != 0:
        raise BenchError("--as-user needs root")
    identity = Identity.of(pw.pw_uid, pw.pw_gid)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, opts, identity))
    proc.start()
    child.close()
    try:
        outcome = parent.recv()
    except EOFError:
        outcome = ("error", f"the benchmark process died (exit code {proc.exitcode})")
    proc.join()
    if outcome[0] == "error":
        raise BenchError(outcome[1])
    return outcome[1]


def bench_dask(opts: Options, user: str | None, client: Any = None) -> dict[str, Any]:
    """:func:`bench` with our transfer run on the configured Dask cluster, as the daemon
    runs a job's (``[movers]``: scheduler and certificates), the nodes copying as ``user``;
    the baselines copy on this host. Root (the client certificate is root's), POSIX only
    (the data set is made here and given to ``user``). ``client``: tests."""
    if not user:
        raise BenchError("--engine dask needs --as-user USER: the nodes copy as that user")
    if os.geteuid() != 0:
        raise BenchError("--engine dask needs root (the Dask client certificate is root's)")
    movers_conf = opts.config.movers
    if client is None and not (movers_conf.scheduler and movers_conf.tls_cert):
        raise BenchError(
            "--engine dask: no Dask cluster in the configuration: set [movers] scheduler,"
            " tls_ca_file, tls_cert and tls_key (docs/scale-out.md)"
        )
    if Location(opts.source).kind == "s3" or Location(opts.destination).kind == "s3":
        raise BenchError("--engine dask: give two directories (S3 is not measured this way yet)")
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise BenchError(f"--as-user {user}: no such user") from None
    runner = DaskRunner(movers_conf, Identity.of(pw.pw_uid, pw.pw_gid), client)
    try:
        out = bench(dataclasses.replace(opts, runner=runner, owner=(pw.pw_uid, pw.pw_gid)))
    finally:
        runner.close()
    out["engine"] = {"name": "dask", "scheduler": movers_conf.scheduler,
                     "nodes": sorted(runner.nodes)}  # fmt: skip
    return out


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
