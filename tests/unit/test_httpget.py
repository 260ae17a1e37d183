"""The HTTPS client's own thread (``httpget.BlockingClient``): whatever happens there, no
caller waits for ever, and a host the site has not allowed is never asked, ahead or not."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bbstage.movers.base import TransferError
from bbstage.movers.implementations import httpget


@pytest.fixture
def stalled() -> Iterator[str]:
    """A server on 127.0.0.1 that takes connections and never answers: its base URL."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.05)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_a_failure_of_the_request_thread_reaches_every_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug in the thread that runs the small requests (here: no handle can be made) is
    raised to each caller waiting there, a read and a size alike; none waits for ever, and
    the next request starts the thread again."""

    def broken(self: httpget.BlockingClient, buffer: int = 0) -> None:
        raise RuntimeError("no handle")

    monkeypatch.setattr(httpget.BlockingClient, "_handle", broken)
    client = httpget.BlockingClient()
    for _ in range(2):
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="no handle"):
            client.read("http://127.0.0.1:9/a", "a", 10)
        with pytest.raises(RuntimeError, match="no handle"):
            client.size("http://127.0.0.1:9/b", "b")
        assert time.monotonic() - started < 5


def test_close_ends_the_requests_still_waiting(stalled: str) -> None:
    """``close`` (the transfer has ended: cancelled, or failed elsewhere) fails the requests
    that wait for a server that does not answer, and refuses new ones; a file fetched ahead
    is dropped."""
    client = httpget.BlockingClient()
    client.fetch(stalled + "/ahead", "ahead", 10)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            client.read(stalled + "/f", "f", 10)
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.3)
    assert reader.is_alive() and not errors  # the server says nothing
    client.close()
    reader.join(5)
    assert not reader.is_alive()
    assert len(errors) == 1 and "ended" in str(errors[0]), errors
    with pytest.raises(TransferError, match="ended"):
        client.read(stalled + "/ahead", "ahead", 10)


def test_a_host_refused_is_never_asked_ahead_and_its_read_is_refused() -> None:
    """``fetch`` (a hint, from the plan's walk) never raises: a host the site has not
    allowed is not asked ahead, and its ``read`` is refused by the same check."""
    asked: list[str] = []

    def check(url: str) -> None:
        asked.append(url)
        raise TransferError(f"{url}: host not allowed")

    client = httpget.BlockingClient(check=check)
    client.fetch("https://192.0.2.1/x", "x", 10)
    with pytest.raises(TransferError, match="not allowed"):
        client.read("https://192.0.2.1/x", "x", 10)
    with pytest.raises(TransferError, match="not allowed"):
        client.read_range("https://192.0.2.1/x", "x", 0, 10, lambda at, data: None)
    assert asked == ["https://192.0.2.1/x"] * 3
    client.close()


def test_the_systems_cas_are_read_from_a_hashed_directory_where_there_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian's layout (OpenSSL's directory hashed): the directory alone. Red Hat's (its
    OpenSSL directory holds the bundle, no hashed names; update-ca-trust's directory-hash
    does): that directory alone. Neither: the file, and the directory only if it is one."""
    import ssl

    bundle = tmp_path / "ca-bundle.crt"
    bundle.write_text("")
    plain, hashed, missing = tmp_path / "certs", tmp_path / "directory-hash", tmp_path / "no"
    plain.mkdir()
    (plain / "ca-bundle.crt").write_text("")
    hashed.mkdir()
    (hashed / "9d66eef0.0").write_text("")

    def layout(capath: Path, red_hat: Path) -> tuple[str | None, str | None]:
        paths = ssl.DefaultVerifyPaths(str(bundle), str(capath), "", "", "", "")
        monkeypatch.setattr(ssl, "get_default_verify_paths", lambda: paths)
        monkeypatch.setattr(httpget, "RED_HAT_HASHED", str(red_hat))
        httpget.system_cas.cache_clear()
        try:
            return httpget.system_cas()
        finally:
            httpget.system_cas.cache_clear()

    assert layout(hashed, missing) == (None, str(hashed))  # Debian, SUSE
    assert layout(plain, hashed) == (None, str(hashed))  # Red Hat 9
    assert layout(plain, missing) == (str(bundle), str(plain))  # the file is read
    assert layout(missing, missing) == (str(bundle), None)
