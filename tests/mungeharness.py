"""A real munged with its own key and socket, started by a test (as the ``munge`` user, as
scripts/local-cluster starts the cluster's)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from .helpers import wait_until


@dataclass
class Munged:
    dir: Path

    @property
    def socket(self) -> Path:
        return self.dir / "munge.socket.2"

    @property
    def pid(self) -> int:
        return int((self.dir / "munged.pid").read_text())

    def start(self) -> None:
        subprocess.run(
            ["runuser", "-u", "munge", "--", "munged", f"--socket={self.socket}",
             f"--key-file={self.dir / 'munge.key'}", f"--pid-file={self.dir / 'munged.pid'}",
             f"--seed-file={self.dir / 'munged.seed'}", f"--log-file={self.dir / 'munged.log'}"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        wait_until(self.socket.exists, 10, f"munged to listen on {self.socket}")

    def stop(self) -> None:
        pid = self.pid
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 10, "munged to stop")


def start_munged(base: Path) -> Munged:
    """A munged with a new random key in a directory of its own under ``base``."""
    path = base / f"munge-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    (path / "munge.key").write_bytes(os.urandom(1024))
    munge = pwd.getpwnam("munge")
    for p in (path, path / "munge.key"):
        os.chown(p, munge.pw_uid, munge.pw_gid)
    (path / "munge.key").chmod(0o400)
    path.chmod(0o755)  # munged wants every directory above its socket searchable by all
    m = Munged(path)
    m.start()
    return m


def remove(m: Munged) -> None:
    try:
        m.stop()
    except (OSError, ValueError, AssertionError):
        pass
    shutil.rmtree(m.dir, ignore_errors=True)
