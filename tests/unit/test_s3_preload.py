"""The executor's forkserver preloads the S3 client libraries, so that a new worker does not
pay their import (~0.3 s) at its first S3 transfer (docs/performance.md)."""

from __future__ import annotations

import multiprocessing
import sys

from bbstage.executor import TransferExecutor


def _loaded(conn: multiprocessing.connection.Connection) -> None:
    conn.send({name: name in sys.modules for name in ("s3fs", "aiobotocore.session")})
    conn.close()


def test_a_worker_starts_with_s3fs_and_aiobotocore_loaded() -> None:
    executor = TransferExecutor(1)
    try:
        ours, theirs = executor._ctx.Pipe()
        proc = executor._ctx.Process(target=_loaded, args=(theirs,))
        proc.start()
        assert ours.poll(30)
        loaded = ours.recv()
        proc.join(10)
    finally:
        executor.shutdown()
    assert loaded == {"s3fs": True, "aiobotocore.session": True}
