"""One retry policy, one budget (``bbstage.movers.retrying``): a request that keeps failing is
sent at most ``retrying.BUDGET`` times in all, whatever the layers between it and the engine."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bbstage.daemon import lifecycle
from bbstage.movers import TransferError, retrying
from bbstage.movers.implementations.s3 import fast
from bbstage.transfer import TransferSpec
from tests.helpers import run_worker, s3_sides


def test_a_policy_waits_tries_minus_one_times_within_its_cap() -> None:
    assert list(retrying.FILE.waits()) == [0.2, 0.4, 0.8, 1.6, 3.2]
    assert list(retrying.REQUEST.waits()) == [0.1, 0.4]
    assert list(retrying.RetryPolicy(tries=4, first=1.0, factor=10, cap=5).waits()) == [1, 5, 5]
    assert retrying.BUDGET == 54


def test_the_engine_takes_its_attempts_from_the_policy() -> None:
    assert lifecycle.ATTEMPTS == retrying.TRANSFER.tries


class _Unavailable(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint that answers every request 503, counting them."""

    count = 0
    lock = threading.Lock()

    def _answer(self) -> None:
        with self.lock:
            type(self).count += 1
        body = b"<Error><Code>ServiceUnavailable</Code><Message>down</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body) if self.command != "HEAD" else 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=["botocore", "lean"])
def client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which S3 client asks: botocore (AWS's path) or the lean one (a site's endpoint)."""
    if request.param == "botocore":
        monkeypatch.setattr(fast.FastS3, "available", staticmethod(lambda *_: False))
    else:
        pytest.importorskip("obstore")
    return str(request.param)


@pytest.fixture
def unavailable() -> Iterator[str]:
    _Unavailable.count = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_one_failing_transfer_sends_a_request_at_most_the_budget(
    unavailable: str, client: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An S3 store that is down: one attempt of the worker sends the object's first request
    ``FILE.tries * REQUEST.tries * LIBRARY_TRIES`` times (the client library adds no tries
    of its own), and the engine makes ``TRANSFER.tries`` attempts: ``BUDGET`` in all. The
    waits are made zero here; their sum is what docs/operations.md gives."""
    for name in ("FILE", "REQUEST"):
        monkeypatch.setattr(retrying, name, retrying.RetryPolicy(getattr(retrying, name).tries))
    conf = {"s3": {"endpoint_url": unavailable}, "credentials": {"key": "k", "secret": "s"}}
    spec = TransferSpec.between("s3://bkt/k", str(tmp_path / "k"), **s3_sides(conf))
    with pytest.raises(TransferError) as caught:
        run_worker(spec)
    assert not caught.value.permanent  # so the engine would try again
    per_attempt = retrying.FILE.tries * retrying.REQUEST.tries * retrying.LIBRARY_TRIES
    assert _Unavailable.count == per_attempt
    assert per_attempt * lifecycle.ATTEMPTS == retrying.BUDGET
