"""The executor's forkserver preloads the S3 client libraries and botocore's S3 model, so
that a new worker pays neither their import (~0.3 s) nor the model's parsing (0.08-0.23 s)
at its first S3 transfer; every S3 client of a process shares that one loader
(docs/performance.md)."""

from __future__ import annotations

import multiprocessing
import sys

from bbstage.daemon.executor import TransferExecutor
from bbstage.movers.implementations.s3.settings import S3Options


def _loaded(conn: multiprocessing.connection.Connection) -> None:
    from bbstage.movers.implementations.s3.common import botocore_loader

    # encodings.idna: else read from disk at a worker's first connection
    names = ("s3fs", "aiobotocore.session", "encodings.idna")
    loaded = {name: name in sys.modules for name in names}
    cached = botocore_loader()._cache  # botocore's per-loader cache, keyed by method and args
    parsed = ("load_service_model", "s3", "service-2", "api_version", None) in cached
    conn.send({**loaded, "s3 model parsed": parsed})
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
    assert all(loaded.values()), loaded


def test_every_s3_client_of_a_process_shares_one_loader_of_botocores_own_data() -> None:
    from bbstage.movers.base import MoverOptions
    from bbstage.movers.implementations.s3 import S3Download
    from bbstage.movers.implementations.s3.common import botocore_loader

    def loader_of_a_new_mover() -> object:
        options = MoverOptions(
            job_id="t", source=S3Options(**{"s3": {"endpoint_url": "http://127.0.0.1:9"}})
        )
        return S3Download(options)._filesystem().session.get_component("data_loader")

    assert loader_of_a_new_mover() is loader_of_a_new_mover() is botocore_loader()
    assert botocore_loader().search_paths == [botocore_loader().BUILTIN_DATA_PATH]
