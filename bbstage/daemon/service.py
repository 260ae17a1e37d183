"""`bbstage daemon`: wire config, state, executor, engine and sockets; stop cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sys
from pathlib import Path

import structlog

import bbstage
from bbstage import log as logsetup
from bbstage.config import Config
from bbstage.daemon import cgroups, metrics, reconcile, usage
from bbstage.daemon.contracts import Executor
from bbstage.daemon.engine import Engine
from bbstage.daemon.executor import TransferExecutor
from bbstage.daemon.schema import NewerSchema
from bbstage.daemon.server import Server
from bbstage.daemon.state import Store

log = structlog.get_logger("bbstage.daemon.service")


def run(config: Config) -> int:
    logsetup.configure(config.log_level)
    for message in config.deprecated:
        log.warning("deprecated configuration", detail=message)
    return asyncio.run(_main(config))


class AlreadyRunning(RuntimeError):
    """Another daemon owns the state directory."""


def lock_state_dir(state_dir: Path) -> int:
    """Hold an exclusive lock on ``state_dir`` for the daemon's lifetime (released by the
    kernel however the process ends): two daemons on one state would undo each other."""
    fd = os.open(state_dir / "daemon.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise AlreadyRunning(
            f"another bbstage daemon (pid {holder}) is using {state_dir}: stop it first"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


async def _main(config: Config) -> int:
    config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        lock_state_dir(config.state_dir)
    except AlreadyRunning as exc:
        log.error("not started", reason=str(exc))
        print(f"bbstage daemon: {exc}", file=sys.stderr)
        return 1
    try:
        store = Store(config.state_dir / "state.db")
    except NewerSchema as exc:
        log.error("not started", reason=str(exc))
        print(f"bbstage daemon: {exc}", file=sys.stderr)
        return 1
    executor: Executor
    if config.movers.executor == "dask":
        try:
            import distributed  # noqa: F401  (only when configured)
        except ImportError:
            message = '[movers] executor = "dask" needs distributed: pip install "bbstage[dask]"'
            log.error("not started", reason=message)
            print(f"bbstage daemon: {message}", file=sys.stderr)
            return 1
        from bbstage.daemon.dask_executor import DaskExecutor

        executor = DaskExecutor(
            config.movers,
            config.transfers,
            policy=config.fairshare.policy,
            weights=config.fairshare.weights,
            stall_timeout=config.stall_timeout,
        )
    else:
        try:  # the workers' bounds before any worker: never a copy without them
            bounds = cgroups.Bounds(config.movers.memory_max, config.movers.cpus)
            cgroups.prepare(config.movers.cgroups, bounds)
        except cgroups.CgroupError as exc:
            log.error("not started", reason=str(exc))
            print(f"bbstage daemon: [movers] cgroups: {exc}", file=sys.stderr)
            return 1
        executor = TransferExecutor(
            config.transfers,
            policy=config.fairshare.policy,
            weights=config.fairshare.weights,
            stall_timeout=config.stall_timeout,
            cgroup=config.movers.cgroups,
            registry=config.registry,
        )
    engine = Engine(config, store, executor)
    engine.subscribe(metrics.observe)
    server = Server(engine)
    stop = asyncio.Event()
    server.stop = stop.set  # bbstage drain ends as SIGTERM does
    await server.start()
    scrapes = await metrics.serve(config, store, executor, config.metrics_address, engine.usage)
    engine.resume()
    await engine.purge_expired()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.create_task(server.serve_forever())
    reconciling = asyncio.create_task(reconcile.forever(engine))
    recording = asyncio.create_task(engine.record_progress())
    measuring = asyncio.create_task(
        usage.forever(engine.usage, engine.active, config.usage_interval)
    )
    log.info("daemon started", version=bbstage.__version__, code=bbstage.where(),
             pools=[p.name for p in config.pools])  # fmt: skip
    await stop.wait()
    log.info("daemon stopping")
    serving.cancel()
    reconciling.cancel()
    recording.cancel()
    measuring.cancel()
    await server.close()
    if scrapes is not None:
        await scrapes.close()
    # Transfers stop; their state stays "running" and resumes on the next start.
    await engine.stop()
    store.close()
    log.info("daemon stopped")
    return 0
