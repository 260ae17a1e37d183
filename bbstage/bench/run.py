"""Run the benchmark here, or in a child process that has become another user first, as
the daemon's workers do (so the user's permissions and quotas apply).

Root and that child talk in JSON arrays over their pipe (``_send``/``_receive``), never in
pickles: the child runs as the user, who may take it over, and root unpickling what it
wrote would run the user's code as root. A transfer the child asks root's runner (Dask) to
run is sent as the directive's fields, and root builds its spec itself, for the user's uid
(``TransferSpec.of_directive``), as the daemon builds a job's.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import pwd
import re
import threading
from multiprocessing.connection import Connection
from typing import Any

from bbstage import movers
from bbstage.bench.model import BenchError, Location, Options
from bbstage.bench.posix import bench_posix
from bbstage.bench.s3 import bench_s3
from bbstage.bench.transfer import DaskRunner
from bbstage.identity import Identity
from bbstage.transfer import Done, Moved, TransferSpec, worker

MAX_MESSAGE = 16 << 20  # bytes of one message on the pipe (a result with its latencies)


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
        while (outcome := _receive(parent))[0] == "run":
            _serve(parent, runner, _relayed_spec(outcome, identity, opts))
    except EOFError:
        outcome = ["error", f"the benchmark process died (exit code {proc.exitcode})"]
    except BenchError:
        proc.kill()
        proc.join()
        raise
    proc.join()
    if outcome[0] == "error" and len(outcome) == 2 and isinstance(outcome[1], str):
        raise BenchError(outcome[1])
    if outcome[0] != "ok" or len(outcome) != 2 or not isinstance(outcome[1], dict):
        raise BenchError("the benchmark process sent a malformed message, refused")
    return outcome[1]


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
        side = spec.source_options or spec.destination_options
        fields = {name: getattr(spec, name) for name in _RELAYED if name != "profile"}
        _send(self._conn, "run", fields | {"profile": getattr(side, "profile", None)})
        while True:
            msg = _receive(self._conn)
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
        _send(self._conn, "moved", event.bytes, event.files)

    def send(self, event: Any) -> None:
        pass  # the plan: the child checks the counts itself


def _serve(conn: Connection, runner: Any, spec: TransferSpec) -> None:
    """Run one relayed transfer; its end (or error) back to the child."""
    try:
        runner(spec, _Forward(conn), threading.Event())
    except movers.TransferError as exc:
        _send(conn, "error", str(exc), exc.permanent)
    except Exception as exc:
        _send(conn, "error", f"{type(exc).__name__}: {exc}", True)
    else:
        _send(conn, "end")


def _child(conn: Connection, opts: Options, identity: Identity) -> None:
    try:
        worker._become(identity)
        os.umask(0o022)
        if opts.cache == "auto":
            opts.cache = "warm"  # the user cannot drop caches
        _send(conn, "ok", bench(opts))
    except Exception as exc:
        _send(conn, "error", f"{type(exc).__name__}: {exc}" if not _ours(exc) else str(exc))
    finally:
        conn.close()


def _ours(exc: Exception) -> bool:
    return isinstance(exc, BenchError | movers.TransferError)


# The fields of a relayed transfer, with their types: the directive, not a spec.
_RELAYED = {
    "job_id": str,
    "source": str,
    "destination": str,
    "source_kind": str,
    "destination_kind": str,
    "tree": bool,
    "glob": bool,
    "checksum": str,
    "overwrite": str,
    "profile": str | None,
}


def _send(conn: Connection, *message: Any) -> None:
    """One message to the other side: a JSON array."""
    conn.send_bytes(json.dumps(message).encode())


def _receive(conn: Connection) -> list[Any]:
    """The next message from the other side: a JSON array that starts with a string, of at
    most ``MAX_MESSAGE`` bytes, or BenchError (EOFError if the pipe closed)."""
    try:
        data = json.loads(conn.recv_bytes(MAX_MESSAGE))
    except OSError as exc:
        if exc.errno is None:  # over MAX_MESSAGE
            raise BenchError("the benchmark process sent a message too long, refused") from None
        raise EOFError() from None
    except (ValueError, RecursionError):  # not JSON (a pickle, say)
        raise BenchError("the benchmark process sent a malformed message, refused") from None
    if not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise BenchError("the benchmark process sent a malformed message, refused")
    return data


def _relayed_spec(message: list[Any], identity: Identity, opts: Options) -> TransferSpec:
    """The spec of a transfer the user's child asks root's runner for, built here for the
    user's uid from exactly the fields of ``_RELAYED``, each of its type."""
    fields = message[1] if len(message) == 2 else None
    if not isinstance(fields, dict) or set(fields) != set(_RELAYED):
        raise BenchError("the benchmark process asked for a malformed transfer, refused")
    for name, kind in _RELAYED.items():
        if not isinstance(fields[name], kind):
            raise BenchError(f"the benchmark process asked for a transfer with a bad {name}")
    if not re.fullmatch(r"bench-[0-9]+", fields["job_id"]):
        raise BenchError("the benchmark process asked for a transfer of another job id")
    options = {"checksum": fields["checksum"], "overwrite": fields["overwrite"]}
    if fields["profile"]:
        options["profile"] = fields["profile"]
    where = ("source", "destination", "source_kind", "destination_kind", "tree", "glob")
    directive = {k: fields[k] for k in where} | {"options": options}
    config = opts.config
    try:
        return TransferSpec.of_directive(
            fields["job_id"],
            directive,
            uid=identity.uid,
            backend_settings=config.backend_settings,
            threads=config.threads_per_transfer,
            chunk_size=config.chunk_size,
        )
    except movers.TransferError as exc:
        raise BenchError(f"the benchmark process asked for a transfer refused: {exc}") from None
