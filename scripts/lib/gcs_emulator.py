"""gcp-storage-emulator as scripts/local-stores starts it: the emulator's own command line
(``gcs_emulator.py start --host H --port P ...``), with a listen queue of 128 instead of
http.server's 5. The emulator serves one request at a time; a client that opens 8-16
connections at once (bbstage's threads, rclone's transfers) overflowed the queue of 5, and
each SYN dropped waits a second before it is sent again: a wait the real service has not."""

from __future__ import annotations

import http.server

http.server.HTTPServer.request_queue_size = 128

from gcp_storage_emulator.__main__ import main  # noqa: E402 - after the queue is set

if __name__ == "__main__":
    main()
