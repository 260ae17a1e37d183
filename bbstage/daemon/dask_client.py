"""The Dask executor's connection to the scheduler: one ``distributed.Client``, made with the
configured certificates when first needed and again after the last one gave up, and a
watcher that gives up a client that stays disconnected.

distributed reconnects a client for ``SCHEDULER_WAIT`` s and then closes it, cancelling its
futures (each attempt then fails transiently and the engine tries again), but an error it
does not expect while reconnecting ends the reconnection and leaves the client "connecting"
for ever, with every future it holds pending (seen in CI: tornado's "IOStream is not idle;
cannot convert to SSL" when a scheduler being killed still accepted the connection; that
job, and every later one, hung). So every ``WATCH_EVERY`` s the watcher looks at the current
client and at those the running attempts were sent through, and one not connected for
``GIVE_UP`` s is handed to ``on_give_up`` (which fails its attempts) and never used again.
The scheduler releases the tasks of a client that went away, so no copy of a given-up
attempt races the next one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from bbstage.config import Movers

log = structlog.get_logger("bbstage.dask")

SCHEDULER_WAIT = 60.0  # seconds distributed tries to reconnect a client before closing it
GIVE_UP = SCHEDULER_WAIT + 15.0  # seconds a client may stay disconnected before it is given up
WATCH_EVERY = 1.0  # seconds between the watcher's looks at the clients
READY_EVERY = 0.5  # seconds between looks for a connected client


def connected(client: Any) -> bool:
    """Whether ``client`` is connected to its scheduler now."""
    return client is not None and client.status == "running"


class Connection:
    def __init__(
        self,
        movers: Movers,
        client: Any,
        in_use: Callable[[], set[Any]],
        on_give_up: Callable[[Any], None],
    ) -> None:
        """``client``: an existing client, which stays the caller's (never closed here);
        ``in_use()``: the clients running attempts were sent through; ``on_give_up(client)``
        fails those of a client given up."""
        self._movers = movers
        self._client: Any = client
        self._given = client
        self._in_use, self._on_give_up = in_use, on_give_up
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def current(self) -> Any:
        """The client now, if any (never makes one)."""
        return self._client

    def client(self) -> Any:
        """The client; a new one if there is none, or the last one closed (the scheduler was
        away longer than ``SCHEDULER_WAIT``) or was given up."""
        with self._lock:
            if self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._watch, name="bbstage-dask-watch", daemon=True
                )
                self._watcher.start()
            if self._client is not None and self._client.status not in ("closing", "closed"):
                return self._client
            from distributed import Client
            from distributed.security import Security

            movers = self._movers
            security = Security(
                tls_ca_file=str(movers.tls_ca_file),
                tls_client_cert=str(movers.tls_cert),
                tls_client_key=str(movers.tls_key),
                require_encryption=True,
            )
            # The timeout bounds the first connection and every reconnection (after that
            # the client closes, and the next transfer makes a new one).
            self._client = Client(
                movers.scheduler, security=security, timeout=SCHEDULER_WAIT, set_as_default=False
            )
            return self._client

    def ready(self, stop: Callable[[], bool]) -> Any:
        """A connected client. Nothing should be sent through one that is not (distributed
        holds it until it reconnects, if it ever does): wait for the scheduler to come back,
        or for the watcher to give the client up and a new one to connect, up to ``GIVE_UP``
        s and a little, or until ``stop()``; then raise the last error."""
        deadline = time.monotonic() + GIVE_UP + 5 * WATCH_EVERY
        while True:
            try:
                client = self.client()
                if connected(client):
                    return client
                error: Exception = ConnectionError(f"the client is {client.status}")
            except Exception as exc:  # e.g. tornado's ValueError from a dying scheduler
                error = exc
            if time.monotonic() >= deadline or stop():
                raise error
            time.sleep(READY_EVERY)

    def close(self) -> None:
        """Stop the watcher and close the client, if it was made here."""
        self._stop.set()
        if self._client is not None and self._client is not self._given:
            _close(self._client)

    def _watch(self) -> None:
        down: dict[Any, float] = {}  # client → since when it has not been connected
        while not self._stop.wait(WATCH_EVERY):
            now = time.monotonic()
            clients = self._in_use() | {self._client}
            down = {c: down.get(c, now) for c in clients if c is not None and not connected(c)}
            for client, since in down.items():
                if now - since >= GIVE_UP:
                    self._give_up(client)

    def _give_up(self, client: Any) -> None:
        with self._lock:
            if self._client is client:
                self._client = None
        log.warning("Dask scheduler unreachable: client given up",
                    scheduler=self._movers.scheduler, status=client.status,
                    seconds=GIVE_UP)  # fmt: skip
        self._on_give_up(client)
        if client is not self._given:
            threading.Thread(target=_close, args=(client,), daemon=True).start()


def _close(client: Any) -> None:
    try:
        client.close(timeout=5)
    except Exception:  # e.g. the error that ended its reconnection, again
        pass
