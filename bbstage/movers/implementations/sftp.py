"""``sftp://[user@]host[:port]/path``: through sshfs (asyncssh) (``SFTPBackend``), with
the user's keys and ``known_hosts`` in ``~/.ssh`` (an unknown host key is refused), never
the user's ``~/.ssh/config`` (it could send the connection to another host than the one
``[sftp] allowed_hosts`` allowed).

SFTP has no atomic upload: a file is written under a temporary name and renamed
(``atomic_put`` False). A big file's ranges are read in asyncssh's parallel blocks, each
checked to be of the file as it was listed (its size and modification time).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from bbstage.movers.backends import Into, UrlRule
from bbstage.movers.implementations.fsstore import Hosts, StoreBackend
from bbstage.movers.implementations.httpget import Changed
from bbstage.settings import Settings

# The ciphers an SFTP connection asks for first where the CPU has AES instructions, before
# asyncssh's own order (chacha20-poly1305 first), as rclone's Go client does: 1 GiB up to the
# local sshd 1.9-2.1 s against 3.0-3.9 s (1.5 s of the client's CPU against 2.5-3.0 s; rclone
# 3.4 s), and the server decrypts faster too.
AES_FIRST = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"


@functools.cache
def cpu_has_aes(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Does this CPU have AES instructions (x86's ``aes`` flag, Arm's ``aes`` feature)?"""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            return any(
                line.split(":", 1)[0].strip() in ("flags", "Features")
                and "aes" in line.split(":", 1)[1].split()
                for line in f
            )
    except OSError:
        return False


class SFTPSettings(Settings, frozen=True):
    """``[sftp]`` of the daemon config: the hosts a URL may name."""

    allowed_hosts: Hosts = ()


class SFTPBackend(StoreBackend):
    """``sftp://[user@]host[:port]/path``: through sshfs (asyncssh), with the user's keys and
    ``known_hosts`` in ``~/.ssh`` (an unknown host key is refused)."""

    name, schemes, section, protocol = "sftp", ("sftp",), "sftp", "sftp"
    atomic_put = False
    port = 22
    # 32 MiB x 4, each read in parallel blocks (read_range): 1 GiB, 3 runs each beside rclone's
    # 287-308 MB/s: 32 x 4 606 MB/s, 64 x 2 606, 128 x 2 623, 1024 x 1 626 (1.6 s of CPU
    # against rclone's 3.2-3.6 s); a seeked handle's joined reads had been 240 (4.5 s)
    ranges = (32 << 20, 4)
    settings_type = SFTPSettings
    env = ()
    preload = ("fsspec", "sshfs")
    url_rule = UrlRule(
        what="host",
        rules="write [user@]host[:port] with a-z A-Z 0-9 . _ - in names",
        chars=("a-z", "A-Z", "0-9", ".", "_", "-", "@", ":"),
        ends=("a-z", "A-Z", "0-9"),
        low=1,
        high=255,
    )

    @classmethod
    def read_range(cls, fs: Any, path: str, start: int, end: int, into: Into) -> int:
        """asyncssh's parallel reads of the range (``read_parallel``), each block handed on
        at its offset as it arrives (sshfs's ``cat_file`` reads whole files; a seeked
        handle's ``read`` joins the blocks into one string first: 1 GiB 240 MB/s with 4.5 s
        of CPU, against rclone's 280-300). The channel comes from sshfs's pool, the errors
        through sshfs's own translation (``wrap_exceptions``).

        A file listed here (``find``, ``info``) must be, after its range is read, as it was
        listed: the same size and modification time (``stat`` of the open file; SFTP
        names whole seconds), else refused, transiently, never staged of two versions nor
        at a size it no longer has; the next try reads the version it has now (a file
        rewritten, its size kept, is read again whole; one of another size is refused for
        it). A file rewritten in place within the second it was listed in, its size kept,
        is not seen changed."""
        from fsspec.asyn import sync
        from sshfs.utils import wrap_exceptions

        @wrap_exceptions
        async def read() -> tuple[int, Any]:
            got = 0
            async with fs._pool.get() as channel, channel.open(path, "rb") as f:
                async for offset, data in await f.read_parallel(end - start, start):
                    into(offset, data)
                    got += len(data)
                return got, await f.stat()

        version = fs.versions.get(path)
        got, now = sync(fs.loop, read)
        if version is not None and (now.size, int(now.mtime or 0)) != version:
            fs.versions[path] = (version[0], int(now.mtime or 0))  # for the next try
            if now.size != version[0]:
                raise Changed(path, f"it has {now.size} bytes, planned {version[0]}")
            raise Changed(path, "modified since it was listed")
        return int(got)

    @classmethod
    def version_of(cls, info: dict[str, Any]) -> Any:
        """A file's modification time, in whole seconds as SFTP names it."""
        mtime = info.get("mtime")
        return int(mtime.timestamp()) if mtime is not None else None

    @classmethod
    def write(cls, fs: Any, path: str, data: bytes) -> None:
        """Open, write, close on a channel of sshfs's pool: three requests. sshfs's
        ``pipe_file`` first makes the parent directories, asking for each part of the path
        a ``mkdir`` and a ``stat`` (14 more requests for a file 7 deep: 1,000 x 64 KiB up
        took 5.0 s, 1.8-2.0 s this way, rclone 4.5-4.9 s). The mover has made the directory,
        once per transfer; one removed since is made again here, as ``pipe_file`` would."""
        from asyncssh import SFTPNoSuchFile
        from fsspec.asyn import sync
        from sshfs.utils import wrap_exceptions

        @wrap_exceptions
        async def write() -> None:
            async with fs._pool.get() as channel:
                try:
                    f = await channel.open(path, "wb")
                except SFTPNoSuchFile:  # the directory removed since
                    await channel.makedirs(os.path.dirname(path), exist_ok=True)
                    f = await channel.open(path, "wb")
                async with f:
                    await f.write(data)

        sync(fs.loop, write)
        fs.invalidate_cache(path)

    @classmethod
    def kwargs(cls, settings: Any, url: str) -> dict[str, Any]:
        from fsspec.utils import infer_storage_options

        where = infer_storage_options(url)
        args: dict[str, Any] = {"host": where["host"]}
        if where.get("port"):
            args["port"] = int(where["port"])
        if where.get("username"):
            args["username"] = where["username"]
        ssh = os.path.join(os.path.expanduser("~"), ".ssh")
        args["known_hosts"] = os.path.join(ssh, "known_hosts")
        # not the user's ~/.ssh/config: its HostName, Port, ProxyJump or ProxyCommand would
        # reach another host than the one checked against [sftp] allowed_hosts
        args["config"] = []
        if cpu_has_aes():
            args["encryption_algs"] = AES_FIRST
        return args

    @classmethod
    def strip(cls, url: str) -> str:
        rest = url.split("://", 1)[1]
        return "/" + rest.split("/", 1)[1] if "/" in rest else "/"

    @classmethod
    def unstrip(cls, url: str, path: str) -> str:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://{rest.split('/', 1)[0]}{path}"
