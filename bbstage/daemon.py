"""`bbstage daemon`: wire config, state, executor, engine and sockets; stop cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import signal

import structlog

from bbstage import log as logsetup
from bbstage import metrics, reconcile
from bbstage.config import Config
from bbstage.engine import Engine
from bbstage.executor import TransferExecutor
from bbstage.server import Server
from bbstage.state import Store

log = structlog.get_logger("bbstage.daemon")


def run(config: Config) -> int:
    logsetup.configure(config.log_level)
    return asyncio.run(_main(config))


async def _main(config: Config) -> int:
    config.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = Store(config.state_dir / "state.db")
    executor = TransferExecutor(config.transfers)
    engine = Engine(config, store, executor)
    server = Server(engine)
    await server.start()
    metrics.serve(engine, config.metrics_address)
    engine.resume()
    await engine.purge_expired()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.create_task(server.serve_forever())
    reconciling = asyncio.create_task(reconcile.forever(engine))
    log.info("daemon started", pools=[p.name for p in config.pools])
    await stop.wait()
    log.info("daemon stopping")
    serving.cancel()
    reconciling.cancel()
    await server.close()
    # Transfers stop; their state stays "running" and resumes on the next start.
    await asyncio.to_thread(executor.shutdown)
    store.close()
    log.info("daemon stopped")
    return 0
