"""The executor's connection: a client made when first needed, given up (never closed when
it is the caller's) once it has not been connected for ``GIVE_UP`` s, a new one after."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from bbstage import config
from bbstage.daemon import dask_client
from bbstage.daemon.dask_client import Connection, connected


class FakeClient:
    def __init__(self, status: str = "running") -> None:
        self.status = status
        self.closed = False

    def close(self, timeout: float = 0) -> None:
        self.closed = True
        self.status = "closed"


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dask_client, "GIVE_UP", 0.3)
    monkeypatch.setattr(dask_client, "WATCH_EVERY", 0.02)


def test_a_client_not_connected_for_give_up_seconds_is_given_up_then_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[FakeClient] = []

    def new_client(*args: Any, **kwargs: Any) -> FakeClient:
        made.append(FakeClient())
        return made[-1]

    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr(distributed, "Client", new_client)
    given = FakeClient()
    up: list[Any] = []
    conn = Connection(config.Movers(executor="dask"), given, set, up.append)
    try:
        assert conn.client() is given
        given.status = "connecting"  # and there it stays
        started = time.monotonic()
        deadline = started + 5
        while not up and time.monotonic() < deadline:
            time.sleep(0.01)
        assert up == [given] and time.monotonic() - started >= 0.3
        assert not given.closed  # the caller's
        assert conn.client() is made[0] and len(made) == 1
    finally:
        conn.close()
    assert made[0].closed  # made here: closed here


def test_a_client_that_reconnects_in_time_is_kept() -> None:
    client = FakeClient("connecting")
    up: list[Any] = []
    conn = Connection(config.Movers(executor="dask"), client, set, up.append)
    conn.client()
    time.sleep(0.2)
    client.status = "running"
    time.sleep(0.4)
    conn.close()
    assert up == [] and conn.current is client


def test_the_clients_of_running_attempts_are_watched_too() -> None:
    old, current = FakeClient("connecting"), FakeClient()
    up: list[Any] = []
    conn = Connection(config.Movers(executor="dask"), current, lambda: {old}, up.append)
    conn.client()
    time.sleep(0.5)
    conn.close()
    assert old in up and current not in up and conn.current is current


def test_close_stops_the_watcher() -> None:
    before = watchers()
    conn = Connection(config.Movers(executor="dask"), FakeClient(), set, print)
    conn.client()
    (mine,) = watchers() - before
    conn.close()
    mine.join(2)
    assert not mine.is_alive()


def watchers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "bbstage-dask-watch"}


def test_connected() -> None:
    assert connected(FakeClient()) and not connected(FakeClient("connecting"))
    assert not connected(None)


def test_ready_waits_for_the_client_to_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dask_client, "READY_EVERY", 0.01)
    client = FakeClient("connecting")
    conn = Connection(config.Movers(executor="dask"), client, set, print)
    threading.Timer(0.1, lambda: setattr(client, "status", "running")).start()
    try:
        assert conn.ready(lambda: False) is client
    finally:
        conn.close()


def test_ready_gives_up_when_told_to_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dask_client, "READY_EVERY", 0.01)
    conn = Connection(config.Movers(executor="dask"), FakeClient("connecting"), set, print)
    try:
        with pytest.raises(ConnectionError, match="connecting"):
            conn.ready(lambda: True)
    finally:
        conn.close()
