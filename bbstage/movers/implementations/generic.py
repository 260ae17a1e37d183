"""Any enabled fsspec store, both ways and store to store: ``gs://`` (gcsfs), ``az://`` and
``abfs://`` (adlfs), ``https://`` (fsspec's HTTP, read-only), ``sftp://`` (sshfs).

One backend class per scheme (``GCSBackend``, ``AzureBackend``, ``HTTPSBackend``,
``SFTPBackend``) on ``StoreBackend``, and one mover, ``GenericMover``, for every pair of
backends that has no fast path of its own (``Backend.movers``): it reads the source through
its backend's filesystem (a local source through ``localfs.open_source``: no symbolic link
followed) and streams it, ``chunk_size`` bytes at a time, to the destination, through the
worker: store to store never touches a disk. The rules of every transfer hold:

* local destinations: a temporary file beside the destination, renamed into place when its
  size is right (``localfs.atomic_file``), mode ``0o644`` (directories ``0o755``) and the
  source's modification time;
* stores that make an object appear whole when its upload completes (GCS, Azure Blob) are
  written in place: the upload is the atomic step; stores that do not (SFTP) get a
  temporary name beside the destination, renamed when complete;
* ``checksum=``: the digest of the bytes read is compared with a digest of what was
  written, read back (a mismatch is retried);
* ``overwrite=``, resume (a file already current is not copied again: same size, and a
  destination at least as new as the source), cancel (between chunks), progress per chunk.

Credentials are the user's own, from their home (the worker runs as the user, ``HOME`` set):
Google's application default credentials (``~/.config/gcloud/application_default_credentials.json``,
written by ``gcloud auth application-default login``); an Azure connection string in
``~/.config/bbstage/azure-connection-string`` (one line, readable by the user alone); SSH keys
and ``known_hosts`` in ``~/.ssh`` (host keys are checked). Errors are translated in one
table (``_ERRORS``, as s3fs's ``errors.py``).
"""

from __future__ import annotations

import datetime as dt
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bbstage.movers import backend as _registry_backend
from bbstage.movers import checksum, localfs
from bbstage.movers.backend import Backend, UrlRule
from bbstage.movers.base import (
    BackendOptions,
    Cancelled,
    FileTask,
    Mover,
    MoverOptions,
    Progress,
    TransferError,
    os_error,
)

FILE_MODE, DIR_MODE = 0o644, 0o755  # of what a store's files become on a local disk

# One table of error translation: (exception type, what the user reads, permanent).
_ERRORS: tuple[tuple[type[BaseException], str, bool], ...] = (
    (FileNotFoundError, "no such file or directory", True),
    (PermissionError, "permission denied", True),
    (IsADirectoryError, "is a directory", True),
    (NotADirectoryError, "not a directory", True),
    (FileExistsError, "already exists", True),
)


def translate(exc: BaseException, url: str) -> TransferError:
    """A store's exception as a ``TransferError`` naming ``url``: the table's kinds are
    permanent, anything else (connections, timeouts, 5xx) is transient (retried)."""
    if isinstance(exc, TransferError):
        return exc
    for kind, words, permanent in _ERRORS:
        if isinstance(exc, kind):
            return TransferError(f"{words}: {url}", permanent=permanent)
    text = str(exc).splitlines()[0] if str(exc) else ""
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    if status in (401, 403):
        return TransferError(f"permission denied: {url} ({text})", permanent=True)
    if status == 404:
        return TransferError(f"no such file or directory: {url}", permanent=True)
    return TransferError(f"{type(exc).__name__}: {text}: {url}", permanent=False)


@dataclass(frozen=True)
class StoreOptions(BackendOptions):
    """A store's side of a transfer: its table of the daemon config (endpoints, a CA
    bundle); never a credential (those are the user's own, in their home)."""

    settings: dict[str, Any] = field(default_factory=dict)


class StoreBackend(Backend):
    """A store reached through fsspec. Subclasses name the fsspec protocol and turn the
    settings (and the URL) into the filesystem's arguments."""

    protocol: ClassVar[str]  # fsspec's name for it
    atomic_put: ClassVar[bool] = True  # an object appears whole when its upload completes
    settings_keys: ClassVar[frozenset[str]] = frozenset({"endpoint_url", "ca_bundle"})
    env = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy")
    preload = ("fsspec", "aiohttp")

    @classmethod
    def check_settings(cls, raw: dict[str, Any]) -> None:
        for key, value in raw.items():
            if key not in cls.settings_keys:
                known = ", ".join(sorted(cls.settings_keys))
                raise TransferError(f"daemon config [{cls.section}]: unknown key {key!r} ({known})")
            if not isinstance(value, str):
                raise TransferError(f"daemon config [{cls.section}] {key}: {value!r} is not text")
        bundle = raw.get("ca_bundle")
        if bundle is not None and not os.path.isfile(bundle):
            raise TransferError(f"daemon config [{cls.section}] ca_bundle: no file {bundle}")

    @classmethod
    def options(
        cls, settings: dict[str, Any], uid: int, directive: dict[str, str]
    ) -> BackendOptions | None:
        return StoreOptions(dict(settings))

    @classmethod
    def kwargs(cls, settings: dict[str, Any], url: str) -> dict[str, Any]:
        """The fsspec filesystem's arguments."""
        return {}

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        import fsspec

        settings = options.settings if isinstance(options, StoreOptions) else {}
        return fsspec.filesystem(
            cls.protocol, skip_instance_cache=True, **cls.kwargs(settings, url)
        )

    @classmethod
    def strip(cls, url: str) -> str:
        return url.split("://", 1)[1]

    @classmethod
    def unstrip(cls, url: str, path: str) -> str:
        """The URL of ``path`` (as the filesystem names it) on the store of ``url``."""
        return url.split("://", 1)[0] + "://" + path


def _ssl_client(bundle: str | None) -> Any:
    """An aiohttp session factory (fsspec's ``get_client``) trusting the system's CAs and,
    if given, the site's ``ca_bundle`` too: verification is never turned off."""
    import ssl

    import aiohttp

    context = ssl.create_default_context()
    if bundle:
        context.load_verify_locations(cafile=bundle)

    async def get_client(**kwargs: Any) -> Any:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context), **kwargs)

    return get_client


class GCSBackend(StoreBackend):
    """``gs://bucket/key``: Google Cloud Storage through gcsfs, with the user's application
    default credentials. ``[gs] endpoint_url`` for a private endpoint (or the emulator, with
    ``anonymous = "true"`` for tests)."""

    name, schemes, section, protocol = "gs", ("gs",), "gs", "gs"
    settings_keys = frozenset({"endpoint_url", "ca_bundle", "project", "anonymous"})
    url_rule = UrlRule(
        what="GCS bucket",
        rules="bucket names have 3-63 characters a-z 0-9 . _ - and start and end with a"
        " letter or digit",
        chars=("a-z", "0-9", ".", "_", "-"),
        ends=("a-z", "0-9"),
        low=3,
        high=63,
    )
    preload = ("fsspec", "aiohttp", "gcsfs")

    @classmethod
    def kwargs(cls, settings: dict[str, Any], url: str) -> dict[str, Any]:
        args: dict[str, Any] = {"token": "anon" if settings.get("anonymous") == "true" else None}
        if settings.get("endpoint_url"):
            args["endpoint_url"] = settings["endpoint_url"]
        if settings.get("project"):
            args["project"] = settings["project"]
        return args

    @classmethod
    def filesystem(cls, options: BackendOptions | None, url: str) -> Any:
        """gcsfs's plain JSON-API filesystem (``gcsfs.core``): the package's default class
        (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT) first asks each bucket's layout over gRPC, which
        a private endpoint or the emulator does not answer (a minute of retries per bucket)."""
        from gcsfs.core import GCSFileSystem

        settings = options.settings if isinstance(options, StoreOptions) else {}
        return GCSFileSystem(skip_instance_cache=True, **cls.kwargs(settings, url))


AZURE_CONNECTION = ".config/bbstage/azure-connection-string"  # under the user's home


class AzureBackend(StoreBackend):
    """``az://container/path`` (and ``abfs://``): Azure Blob Storage through adlfs, with the
    user's own connection string (``~/.config/bbstage/azure-connection-string``)."""

    name, schemes, section, protocol = "az", ("az", "abfs"), "az", "az"
    url_rule = UrlRule(
        what="Azure container",
        rules="container names have 3-63 characters a-z 0-9 - and start and end with a"
        " letter or digit",
        chars=("a-z", "0-9", "-"),
        ends=("a-z", "0-9"),
        low=3,
        high=63,
    )
    preload = ("fsspec", "aiohttp", "adlfs")

    @classmethod
    def kwargs(cls, settings: dict[str, Any], url: str) -> dict[str, Any]:
        path = os.path.join(os.path.expanduser("~"), AZURE_CONNECTION)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as f:
                if os.fstat(f.fileno()).st_mode & 0o077:
                    raise TransferError(
                        f"{path} is readable by others: chmod 600 it (it holds your key)"
                    )
                text = f.read().strip()
        except OSError as exc:
            raise TransferError(
                f"no Azure credentials: put your storage account's connection string in {path}"
                f" ({exc.strerror})"
            ) from None
        return {"connection_string": text}


class HTTPSBackend(StoreBackend):
    """``https://host/path``: a source only, through fsspec's HTTP (aiohttp), TLS verified
    against the system's CAs and ``[https] ca_bundle``."""

    name, schemes, section, protocol = "https", ("https",), "https", "https"
    read_only = True
    settings_keys = frozenset({"ca_bundle"})
    url_rule = UrlRule(
        what="host",
        rules="host names have 1-255 characters a-z A-Z 0-9 . - and an optional :port",
        chars=("a-z", "A-Z", "0-9", ".", "-", ":"),
        ends=("a-z", "A-Z", "0-9"),
        low=1,
        high=255,
    )

    @classmethod
    def kwargs(cls, settings: dict[str, Any], url: str) -> dict[str, Any]:
        return {"get_client": _ssl_client(settings.get("ca_bundle")), "simple_links": False}

    @classmethod
    def strip(cls, url: str) -> str:
        return url

    @classmethod
    def unstrip(cls, url: str, path: str) -> str:
        return path

    @classmethod
    def name_of(cls, rel: str) -> str:
        """A listing's links are URLs: percent-encoded (``a%20b`` is the file ``a b``)."""
        from urllib.parse import unquote

        return unquote(rel)


class SFTPBackend(StoreBackend):
    """``sftp://[user@]host[:port]/path``: through sshfs (asyncssh), with the user's keys and
    ``known_hosts`` in ``~/.ssh`` (an unknown host key is refused)."""

    name, schemes, section, protocol = "sftp", ("sftp",), "sftp", "sftp"
    atomic_put = False
    settings_keys = frozenset()
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
    def kwargs(cls, settings: dict[str, Any], url: str) -> dict[str, Any]:
        from fsspec.utils import infer_storage_options

        where = infer_storage_options(url)
        args: dict[str, Any] = {"host": where["host"]}
        if where.get("port"):
            args["port"] = int(where["port"])
        if where.get("username"):
            args["username"] = where["username"]
        ssh = os.path.join(os.path.expanduser("~"), ".ssh")
        args["known_hosts"] = os.path.join(ssh, "known_hosts")
        return args

    @classmethod
    def strip(cls, url: str) -> str:
        rest = url.split("://", 1)[1]
        return "/" + rest.split("/", 1)[1] if "/" in rest else "/"

    @classmethod
    def unstrip(cls, url: str, path: str) -> str:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://{rest.split('/', 1)[0]}{path}"


def _mtime_ns(info: dict[str, Any]) -> int | None:
    """A store entry's modification time (the keys differ by store)."""
    for key in ("mtime", "last_modified", "updated", "LastModified", "modified", "timeCreated"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, dt.datetime):
            stamp = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
            return int(stamp.timestamp() * 1e9)
        if isinstance(value, int | float):
            return int(value * 1e9)
        if isinstance(value, str):
            try:
                parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            return int(
                (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)).timestamp() * 1e9
            )
    return None


class _Side:
    """One side of a transfer: its backend, and its filesystem (made at first use, in the
    worker, as the user; per URL authority for stores whose host is in the URL)."""

    def __init__(self, kind: str, options: BackendOptions | None) -> None:
        self.backend = _registry_backend(kind)
        self.options = options
        self.local = self.backend.local
        self._fs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def fs(self, url: str) -> Any:
        authority = url.split("://", 1)[1].split("/", 1)[0] if "://" in url else ""
        with self._lock:
            if authority not in self._fs:
                try:
                    self._fs[authority] = self.backend.filesystem(self.options, url)
                except TransferError:
                    raise
                except Exception as exc:
                    raise translate(exc, url) from None
            return self._fs[authority]

    def path(self, url: str) -> str:
        return url if self.local else self.backend.strip(url)

    def info(self, url: str) -> dict[str, Any] | None:
        """The entry at ``url``, or None if there is none."""
        if self.local:
            try:
                st = os.stat(url)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise os_error(exc, url) from None
            kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
            return {"type": kind, "size": st.st_size, "mtime": st.st_mtime_ns / 1e9}
        try:
            return dict(self.fs(url).info(self.path(url)))
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise translate(exc, url) from None


class GenericMover(Mover):
    """Any source to any destination through fsspec (see the module's docstring)."""

    def __init__(self, options: MoverOptions) -> None:
        super().__init__(options)
        checksum.check(options.checksum)
        self.src = _Side(options.source_kind, options.source)
        self.dst = _Side(options.destination_kind, options.destination)

    # -- plan -----------------------------------------------------------------------------

    def plan(self, src: str, dst: str, *, tree: bool, glob: bool) -> Iterator[FileTask]:
        if self.src.local:
            return self._plan_local(src, dst, tree=tree, glob=glob)
        return iter(self._plan_store(src, dst, tree=tree, glob=glob))

    def _plan_local(self, src: str, dst: str, *, tree: bool, glob: bool) -> Iterator[FileTask]:
        for task in localfs.plan_local(src, dst, tree=tree, glob=glob):
            if task.kind == "link":  # a store has no links: the file it names
                try:
                    st = os.stat(task.src)
                except OSError as exc:
                    raise os_error(exc, task.src) from None
                if not stat.S_ISREG(st.st_mode):
                    yield FileTask(task.src, task.dst, "special")
                    continue
                task = FileTask(
                    task.src, task.dst, "file", st.st_size, None, st.st_mtime_ns, follow=True
                )
            yield task

    def _plan_store(self, src: str, dst: str, *, tree: bool, glob: bool) -> list[FileTask]:
        fs, root, backend = self.src.fs(src), self.src.path(src), self.src.backend
        try:
            if glob:
                found = fs.glob(root, detail=True)
                tasks = [
                    self._task(
                        backend.unstrip(src, p), dst.rstrip("/") + "/" + p.rsplit("/", 1)[-1], i
                    )
                    for p, i in sorted(found.items())
                    if i.get("type") != "directory"
                ]
                if not tasks:
                    raise TransferError(f"no such file or directory: nothing matches {src}")
                return tasks
            if not tree:
                info = fs.info(root)
                if info.get("type") == "directory":
                    raise TransferError(
                        f"is a directory: {src} (end both locations with / for a tree)"
                    )
                return [self._task(src, dst, info)]
            found = fs.find(root.rstrip("/"), withdirs=True, detail=True)
        except TransferError:
            raise
        except Exception as exc:
            raise translate(exc, src) from None
        if not found and not fs.isdir(root.rstrip("/")):
            raise TransferError(f"no such file or directory: {src}")
        top = root.rstrip("/") + "/"
        tasks = [FileTask(src, dst, "dir", mode=DIR_MODE)] if self.dst.local else []
        for path, info in sorted(found.items()):
            rel = path[len(top) :] if path.startswith(top) else ""
            if not rel:
                continue
            target = dst.rstrip("/") + "/" + backend.name_of(rel)
            if info.get("type") != "directory" and info.get("size") is None:
                info = self._call(lambda p=path: fs.info(p), src)  # a listing without sizes
            if info.get("type") == "directory":
                if self.dst.local:
                    tasks.append(FileTask(src + rel, target, "dir", mode=DIR_MODE))
                continue
            tasks.append(self._task(src.rstrip("/") + "/" + rel, target, info))
        return tasks

    def _task(self, src: str, dst: str, info: dict[str, Any]) -> FileTask:
        size = int(info.get("size") or 0)
        return FileTask(src, dst, "file", size, FILE_MODE, _mtime_ns(info))

    # -- current, newer -------------------------------------------------------------------

    def current(self, task: FileTask) -> bool | None:
        if self.dst.local:
            return localfs.current(task)
        info = self.dst.info(task.dst)
        if info is None:
            return None
        if task.kind != "file" or info.get("type") == "directory":
            return False
        mtime = _mtime_ns(info)
        return int(info.get("size") or 0) == task.size and (mtime or 0) >= (task.mtime_ns or 0)

    def newer(self, task: FileTask) -> bool:
        if self.dst.local:
            return super().newer(task)
        info = self.dst.info(task.dst)
        return info is not None and (_mtime_ns(info) or 0) >= (task.mtime_ns or 0)

    # -- copy -----------------------------------------------------------------------------

    def copy(self, task: FileTask, progress: Progress, cancel: threading.Event) -> None:
        if cancel.is_set():
            raise Cancelled()
        if task.kind == "dir":
            if self.dst.local:
                return localfs.make_dir(task)
            if not self.dst.backend.atomic_put:  # a real directory tree (SFTP)
                self._call(
                    lambda: self.dst.fs(task.dst).makedirs(self.dst.path(task.dst), exist_ok=True),
                    task.dst,
                )
            return None
        if task.kind != "file":
            raise TransferError(f"{task.src}: a {task.kind} cannot be copied to {task.dst}")
        digest = checksum.new(self.options.checksum) if self.options.checksum != "none" else None
        with self._reader(task) as source:
            if self.dst.local:
                with localfs.atomic_file(task, self.options.job_id, progress) as fd:
                    self._pump(task, source, lambda b: _write_all(fd, b), progress, cancel, digest)
                    if (
                        digest is not None
                        and checksum.digest_fd(self.options.checksum, fd) != digest.hexdigest()
                    ):
                        raise TransferError(
                            f"checksum mismatch ({self.options.checksum}): {task.src}",
                            permanent=False,
                        )
                return None
            self._put(task, source, progress, cancel, digest)
        return None

    def _reader(self, task: FileTask) -> Any:
        if self.src.local:
            return os.fdopen(localfs.open_source(task.src, follow=task.follow), "rb", buffering=0)
        return self._call(
            lambda: self.src.fs(task.src).open(
                self.src.path(task.src), "rb", block_size=self.options.chunk_size
            ),
            task.src,
        )

    def _pump(
        self,
        task: FileTask,
        source: Any,
        write: Any,
        progress: Progress,
        cancel: threading.Event,
        digest: Any,
    ) -> None:
        """Read ``source`` to its end, ``chunk_size`` bytes at a time, into ``write``."""
        step = max(1 << 20, min(self.options.chunk_size, 16 << 20))
        seen = 0
        while True:
            if cancel.is_set():
                raise Cancelled()
            block = self._call(lambda: source.read(step), task.src)
            if not block:
                break
            if digest is not None:
                digest.update(block)
            self._call(lambda b=block: write(b), task.dst)
            seen += len(block)
            progress.add(len(block))
        if seen != task.size:
            progress.add(-seen)
            raise TransferError(
                f"size mismatch: read {seen} bytes of {task.src}, planned {task.size}",
                permanent=False,
            )

    def _put(
        self, task: FileTask, source: Any, progress: Progress, cancel: threading.Event, digest: Any
    ) -> None:
        fs, final = self.dst.fs(task.dst), self.dst.path(task.dst)
        atomic = self.dst.backend.atomic_put
        target = final if atomic else localfs.temp_name(final, self.options.job_id)
        if not atomic:
            self._call(lambda: fs.makedirs(os.path.dirname(final), exist_ok=True), task.dst)
        out = self._call(lambda: fs.open(target, "wb"), task.dst)
        try:
            self._pump(task, source, out.write, progress, cancel, digest)
            self._call(out.close, task.dst)
        except BaseException:
            _discard(out)
            if not atomic:
                _quietly(lambda: fs.rm_file(target))
            raise
        try:
            if digest is not None:
                again = checksum.new(self.options.checksum)
                with self._call(lambda: fs.open(target, "rb"), task.dst) as check:
                    while block := check.read(8 << 20):
                        again.update(block)
                if again.hexdigest() != digest.hexdigest():
                    _quietly(lambda: fs.rm_file(target))
                    raise TransferError(
                        f"checksum mismatch ({self.options.checksum}): {task.src}", permanent=False
                    )
            if not atomic:
                self._call(lambda: fs.mv(target, final), task.dst)
        except BaseException:
            if not atomic:
                _quietly(lambda: fs.rm_file(target))
            raise

    def _call(self, fn: Any, url: str) -> Any:
        try:
            return fn()
        except (TransferError, Cancelled):
            raise
        except Exception as exc:
            raise translate(exc, url) from None


def _write_all(fd: int, block: bytes) -> None:
    view = memoryview(block)
    while view:
        view = view[os.write(fd, view) :]


def _discard(out: Any) -> None:
    """Drop an unfinished upload (no partial object is committed)."""
    discard = getattr(out, "discard", None)
    _quietly(discard if discard is not None else out.close)


def _quietly(fn: Any) -> None:
    try:
        fn()
    except Exception:
        pass
