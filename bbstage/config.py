"""Daemon configuration: a TOML file (tomllib) with documented defaults (docs/configuration.md)."""

from __future__ import annotations

import pwd
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bbstage import movers
from bbstage.units import parse_size

DEFAULT_PATH = Path("/etc/bbstage/bbstage.toml")


class ConfigError(ValueError):
    """The configuration file is invalid; the message names the key."""


def _whole(value: Any) -> int:
    """A TOML integer (a boolean is not one, though Python's bool is an int)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a whole number (write it unquoted, e.g. 4)")
    return value


def _number(value: Any) -> float:
    """A TOML integer or float (not a boolean, not a quoted string)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number (write it unquoted, e.g. 7.5)")
    return float(value)


def _text(value: Any) -> str:
    """A TOML string (``true`` or ``4`` unquoted is a mistake, not the text "True")."""
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string (quote it)")
    return value


@dataclass(frozen=True)
class Pool:
    """A scratch pool: per-job directories under ``root``, at most ``capacity`` bytes in all."""

    name: str
    root: Path
    capacity: int
    granularity: int = 1 << 20


@dataclass(frozen=True)
class Movers:
    """Where transfers run: ``executor`` ``local`` (worker processes on the daemon's host,
    bbstage/daemon/executor.py), or ``dask`` (tasks on a Dask cluster of transfer nodes, TLS with
    client certificates only: bbstage/daemon/dask_executor.py, docs/scale-out.md)."""

    executor: str = "local"
    scheduler: str = ""  # tls://host:port
    tls_ca_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    resources: str = "dtn"  # each task asks its workers for one unit of this resource
    shards: int = 0  # a tree is split into this many tasks (0: one per worker with it)
    range_min: int = 1 << 30  # one file this big is split across the nodes (0: never)
    split_min: int = 64 << 20  # a tree this big is split across the nodes
    # The local workers' cgroup (bbstage/daemon/cgroups.py): its directories and bounds.
    cgroups: tuple[Path, ...] = ()
    memory_max: int | None = None  # bytes
    cpus: float | None = None


@dataclass(frozen=True)
class FairShare:
    """How the transfer slots are shared among users (bbstage/daemon/fairshare.py): ``fair``
    (per-user queues, equal or ``weights``-ed shares) or ``fifo`` (one queue, arrival order);
    ``weights``: uid → weight (1 for everyone else)."""

    policy: str = "fair"
    weights: dict[int, float] = field(default_factory=dict)


def _fairshare(data: dict[str, Any], source: str) -> FairShare:
    """The [fairshare] section; weights' keys are user names or uids, resolved now."""
    where = f"{source}: [fairshare]"
    unknown = set(data) - {"policy", "weights"}
    if unknown:
        raise ConfigError(f"{where} unknown key(s) {sorted(unknown)}")
    policy = data.get("policy", "fair")
    if policy not in ("fair", "fifo"):
        raise ConfigError(f"{where} policy: {policy!r} is not fair or fifo")
    raw = data.get("weights", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} weights: a table of user = weight, e.g. {{ alice = 2 }}")
    weights: dict[int, float] = {}
    for user, value in raw.items():
        try:
            weight = _number(value)
        except ValueError as exc:
            raise ConfigError(f"{where} weights.{user}: {exc}") from None
        if weight <= 0:
            raise ConfigError(f"{where} weights.{user}: {weight:g} is not above 0")
        try:
            uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
        except KeyError:
            raise ConfigError(f"{where} weights.{user}: no such user on this host") from None
        weights[uid] = weight
    return FairShare(policy, weights)


def _positive(value: Any) -> float:
    """A number above 0."""
    number = _number(value)
    if number <= 0:
        raise ValueError(f"{number:g} is not above 0")
    return number


def _count(value: Any) -> int:
    """A TOML integer, 0 or more."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a whole number, 0 or more")
    return value


def _list(value: Any) -> list[str]:
    """A TOML list of strings."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{value!r} is not a list of strings")
    return value


def _movers(data: dict[str, Any], source: str, deprecated: list[str]) -> Movers:
    """The [movers] section; ``dask`` needs a ``tls://`` scheduler and all three TLS files.
    An old key still read is told in ``deprecated``."""

    def path(value: Any) -> Path:
        return Path(_text(value))

    keys = {"executor": _text, "scheduler": _text, "tls_ca_file": path, "tls_cert": path,
            "tls_key": path, "resources": _text, "shards": _count,
            "range_min": parse_size, "split_min": parse_size,
            "cgroups": lambda v: tuple(map(path, _list(v))), "memory_max": parse_size,
            "cpus": _positive}  # fmt: skip
    kwargs: dict[str, Any] = {}
    data = dict(data)
    if "engine" in data:  # its name until 2026-11: the executor, not bbstage.daemon.engine
        if "executor" in data:
            raise ConfigError(f"{source}: [movers] engine is the old name of executor: keep one")
        deprecated.append(f"{source}: [movers] engine is deprecated: write executor instead")
        data["executor"] = data.pop("engine")
    for key, value in data.items():
        if key not in keys:
            raise ConfigError(f"{source}: [movers] unknown key {key!r}")
        try:
            kwargs[key] = keys[key](value)
        except ValueError as exc:
            raise ConfigError(f"{source}: [movers] {key}: {exc}") from None
    movers = Movers(**kwargs)
    if movers.executor not in ("local", "dask"):
        raise ConfigError(f"{source}: [movers] executor: {movers.executor!r} is not local or dask")
    if movers.executor == "dask":
        if not movers.scheduler.startswith("tls://"):
            raise ConfigError(
                f'{source}: [movers] scheduler: executor = "dask" needs a tls:// address'
                f" (mutual TLS is required), not {movers.scheduler!r}"
            )
        for key in ("tls_ca_file", "tls_cert", "tls_key"):
            if getattr(movers, key) is None:
                raise ConfigError(f'{source}: [movers] {key}: required with executor = "dask"')
        if movers.cgroups:
            raise ConfigError(f"{source}: [movers] cgroups: bounds the local workers only;"
                              " bound Dask's workers on their transfer nodes")  # fmt: skip
    if (movers.memory_max or movers.cpus) and not movers.cgroups:
        raise ConfigError(f"{source}: [movers] memory_max and cpus need cgroups: the"
                          " directories of the workers' cgroup (docs/operations.md)")  # fmt: skip
    return movers


@dataclass(frozen=True)
class Config:
    socket: Path = Path("/run/bbstage/control.sock")
    user_socket: Path = Path("/run/bbstage/user.sock")
    state_dir: Path = Path("/var/lib/bbstage")
    control_group: str | None = None
    admin_group: str | None = None
    log_level: str = "info"
    transfers: int = 4
    threads_per_transfer: int = 8
    chunk_size: int = 64 << 20
    retention_days: float = 7.0
    slurm_conf: Path | None = None
    reconcile_interval: float = 10.0
    usage_interval: float = 60.0  # seconds between measures of the jobs' scratch (0: never)
    stall_timeout: float = 300.0
    metrics_address: str = "127.0.0.1:9754"
    api_address: str = ""  # host:port of the munge-authenticated network API; "" = off
    munge_socket: Path = Path("/run/munge/munge.socket.2")  # munged that checks API requests
    job_check: str = "slurm"  # in-job copies: "slurm" (squeue) or "state" (the record only)
    pools: tuple[Pool, ...] = field(default_factory=tuple)
    # Backends enabled besides posix and s3 (``[backends] enabled``), and each enabled
    # backend's own table of this file by its name (``[s3]``, ``[gs]``), checked by it.
    backends: tuple[str, ...] = ()
    backend_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    movers: Movers = field(default_factory=Movers)
    fairshare: FairShare = field(default_factory=FairShare)
    # Old keys still read, each with what to write instead: the daemon logs them at start.
    deprecated: tuple[str, ...] = ()

    def pool(self, name: str | None) -> Pool | None:
        """The named pool, or the first one when ``name`` is empty."""
        if not self.pools:
            return None
        if not name:
            return self.pools[0]
        return next((p for p in self.pools if p.name == name), None)


_DAEMON_KEYS = {
    "socket": Path,
    "user_socket": Path,
    "state_dir": Path,
    "control_group": _text,
    "admin_group": _text,
    "log_level": _text,
    "transfers": _whole,
    "threads_per_transfer": _whole,
    "chunk_size": parse_size,
    "retention_days": _number,
    "slurm_conf": Path,
    "reconcile_interval": _number,
    "usage_interval": _number,
    "stall_timeout": _positive,
    "metrics_address": _text,
    "api_address": lambda v: _address(_text(v)),
    "munge_socket": Path,
    "job_check": lambda v: _choice(_text(v), ("slurm", "state")),
}


def _address(value: str) -> str:
    """ "" (off) or host:port."""
    host, _, port = value.rpartition(":")
    if value and not (host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f'{value!r} is not host:port (e.g. 0.0.0.0:9755), or "" for off')
    return value


def _choice(value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
    return value


def _backends(raw: Any, source: str) -> tuple[str, ...]:
    """``[backends] enabled``: the backends to enable besides posix and s3."""
    if not isinstance(raw, dict) or set(raw) - {"enabled"}:
        raise ConfigError(f"{source}: [backends] takes only enabled = [...]")
    enabled = raw.get("enabled", [])
    if not isinstance(enabled, list) or not all(isinstance(k, str) for k in enabled):
        raise ConfigError(f'{source}: [backends] enabled: a list of names, e.g. ["gs", "az"]')
    return tuple(enabled)


def load(path: Path | str = DEFAULT_PATH) -> Config:
    """Read and check a config file; a missing file means all defaults."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text()) if path.exists() else {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return from_dict(data, source=str(path))


@dataclass(frozen=True)
class ClientSettings:
    """What a client (``bbstage status``, ``copy``, ``bbstage.api``) needs of the config: where
    the daemon listens. Read alone, so a login or compute node with the site's file needs none
    of the daemon's own files (a CA bundle, pools, credentials)."""

    user_socket: Path = Config.user_socket
    api_address: str = Config.api_address
    munge_socket: Path = Config.munge_socket


def load_client(path: Path | str = DEFAULT_PATH) -> ClientSettings:
    """The ``[daemon]`` keys a client needs, checked as the daemon checks them; the rest of
    the file is not read (a missing file means the defaults)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text()) if path.exists() else {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    daemon = data.get("daemon", {})
    kwargs: dict[str, Any] = {}
    for key in ("user_socket", "api_address", "munge_socket"):
        if key in daemon:
            try:
                kwargs[key] = _DAEMON_KEYS[key](daemon[key])
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{path}: [daemon] {key}: {exc}") from None
    return ClientSettings(**kwargs)


def from_dict(data: dict[str, Any], source: str = "<config>") -> Config:
    kwargs: dict[str, Any] = {}
    try:
        kwargs["backends"] = _backends(data.get("backends", {}), source)
        # Every process reads its config first: from here on the registry, and with it the
        # directive parser and the forkserver's preloads, know the enabled backends.
        movers.enable(kwargs["backends"])
        tables = {movers.backend(k).section: k for k in movers.enabled()}
        tables.pop(None, None)
    except movers.TransferError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    unknown = set(data) - {"daemon", "pools", "movers", "fairshare", "backends"} - set(tables)
    if unknown:
        hint = ""
        if unknown & set(movers.known_implementations):
            hint = " (a backend's table: add the backend to [backends] enabled)"
        raise ConfigError(f"{source}: unknown section(s) {sorted(unknown)}{hint}")
    for key, value in data.get("daemon", {}).items():
        if key not in _DAEMON_KEYS:
            raise ConfigError(f"{source}: [daemon] unknown key {key!r}")
        try:
            kwargs[key] = _DAEMON_KEYS[key](value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: [daemon] {key}: {exc}") from None
    pools = []
    for i, raw in enumerate(data.get("pools", [])):
        try:
            pools.append(
                Pool(
                    name=str(raw["name"]),
                    root=Path(raw["root"]),
                    capacity=parse_size(raw["capacity"]),
                    granularity=parse_size(raw.get("granularity", "1M")),
                )
            )
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"{source}: [[pools]] #{i + 1}: {exc}") from None
    kwargs["pools"] = tuple(pools)
    kwargs["backend_settings"] = {t: dict(data[t]) for t in tables if t in data}
    deprecated: list[str] = []
    kwargs["movers"] = _movers(data.get("movers", {}), source, deprecated)
    kwargs["deprecated"] = tuple(deprecated)
    kwargs["fairshare"] = _fairshare(data.get("fairshare", {}), source)
    try:
        # A typo in a backend's table is an error now, not at staging. The registry imports
        # the backends (~60 ms for S3) only here: config itself imports none.
        movers.check_settings(kwargs["backend_settings"])
    except movers.TransferError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return Config(**kwargs)
