"""Daemon configuration: a TOML file (tomllib) with documented defaults (docs/configuration.md).

Each table is read once into its frozen type (``bbstage.settings``), by the rules of
``bbstage.kinds``: ``[daemon]`` (``Daemon``), ``[movers]`` (``Movers``), ``[fairshare]``
(``FairShare``), ``[[pools]]`` (``Pool``), ``[backends]`` (``Backends``), and each enabled
backend's own table by its type in the backend's module (``Backend.settings_type``).
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bbstage import movers
from bbstage.clientconfig import DEFAULT_PATH, ClientSettings, load_client, read
from bbstage.kinds import (
    Address,
    ConfigError,
    Count,
    FilePath,
    Number,
    Positive,
    Seconds,
    Size,
    Strings,
    Text,
    choice,
)
from bbstage.settings import Settings, convert

__all__ = [
    "DEFAULT_PATH", "ClientSettings", "Config", "ConfigError", "Daemon", "FairShare", "Movers",
    "Pool", "from_dict", "load", "load_client",
]  # fmt: skip

UNSET: Any = msgspec.UNSET


class Pool(Settings, frozen=True):
    """A scratch pool: per-job directories under ``root``, at most ``capacity`` bytes in all."""

    name: Text
    root: FilePath
    capacity: Size
    granularity: Size = 1 << 20


class Movers(Settings, frozen=True):
    """Where transfers run: ``executor`` ``local`` (worker processes on the daemon's host,
    bbstage/daemon/executor.py), or ``dask`` (tasks on a Dask cluster of transfer nodes, TLS with
    client certificates only: bbstage/daemon/dask_executor.py, docs/scale-out.md)."""

    executor: choice("local", "dask") = "local"  # type: ignore[valid-type]
    scheduler: Text = ""  # tls://host:port
    tls_ca_file: FilePath | None = None
    tls_cert: FilePath | None = None
    tls_key: FilePath | None = None
    resources: Text = "dtn"  # each task asks its workers for one unit of this resource
    shards: Count = 0  # a tree is split into this many tasks (0: one per worker with it)
    range_min: Size = 1 << 30  # one file this big is split across the nodes (0: never)
    split_min: Size = 64 << 20  # a tree this big is split across the nodes
    # The local workers' cgroup (bbstage/daemon/cgroups.py): its directories and bounds.
    cgroups: tuple[FilePath, ...] = ()
    memory_max: Size | None = None  # bytes
    cpus: Positive | None = None


class FairShare(Settings, frozen=True):
    """How the transfer slots are shared among users (bbstage/daemon/fairshare.py): ``fair``
    (per-user queues, equal or ``weights``-ed shares) or ``fifo`` (one queue, arrival order);
    ``weights``: uid → weight (1 for everyone else; the file names users or uids)."""

    policy: choice("fair", "fifo") = "fair"  # type: ignore[valid-type]
    weights: dict[int, float] = {}


class Backends(Settings, frozen=True):
    """``[backends]``: the backends to enable besides posix and s3."""

    enabled: Strings = ()


class Daemon(Settings, frozen=True):
    """``[daemon]``: its keys' kinds; a key the file does not set is unset here, its default
    is ``Config``'s."""

    socket: FilePath = UNSET
    user_socket: FilePath = UNSET
    state_dir: FilePath = UNSET
    control_group: Text = UNSET
    admin_group: Text = UNSET
    log_level: Text = UNSET
    transfers: Count = UNSET
    threads_per_transfer: Count = UNSET
    chunk_size: Size = UNSET
    retention_days: Number = UNSET
    slurm_conf: FilePath = UNSET
    reconcile_interval: Number = UNSET
    usage_interval: Number = UNSET
    stall_timeout: Seconds = UNSET
    metrics_address: Text = UNSET
    api_address: Address = UNSET
    munge_socket: FilePath = UNSET
    job_check: choice("slurm", "state") = UNSET  # type: ignore[valid-type]


def _fairshare(data: Any, where: str) -> FairShare:
    """The [fairshare] table; weights' keys are user names or uids, resolved now."""
    raw = data.get("weights", {}) if isinstance(data, dict) else {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} weights: a table of user = weight, e.g. {{ alice = 2 }}")
    weights: dict[int, float] = {}
    for user, value in raw.items():
        try:
            weight = Positive.check(value)
        except ValueError as exc:
            raise ConfigError(f"{where} weights.{user}: {exc}") from None
        try:
            uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
        except KeyError:
            raise ConfigError(f"{where} weights.{user}: no such user on this host") from None
        weights[uid] = weight
    table = {**data, "weights": weights} if isinstance(data, dict) else data
    return convert(table, FairShare, where)


def _movers(data: Any, where: str, deprecated: list[str]) -> Movers:
    """The [movers] table; ``dask`` needs a ``tls://`` scheduler and all three TLS files.
    An old key still read is told in ``deprecated``."""
    if isinstance(data, dict) and "engine" in data:
        # its name until 2026-11: the executor, not bbstage.daemon.engine
        if "executor" in data:
            raise ConfigError(f"{where} engine is the old name of executor: keep one")
        deprecated.append(f"{where} engine is deprecated: write executor instead")
        data = {("executor" if k == "engine" else k): v for k, v in data.items()}
    movers = convert(data, Movers, where)
    if movers.executor == "dask":
        if not movers.scheduler.startswith("tls://"):
            raise ConfigError(
                f'{where} scheduler: executor = "dask" needs a tls:// address'
                f" (mutual TLS is required), not {movers.scheduler!r}"
            )
        for key in ("tls_ca_file", "tls_cert", "tls_key"):
            if getattr(movers, key) is None:
                raise ConfigError(f'{where} {key}: required with executor = "dask"')
        if movers.cgroups:
            raise ConfigError(f"{where} cgroups: bounds the local workers only;"
                              " bound Dask's workers on their transfer nodes")  # fmt: skip
    if (movers.memory_max or movers.cpus) and not movers.cgroups:
        raise ConfigError(f"{where} memory_max and cpus need cgroups: the"
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
    backend_settings: dict[str, Settings] = field(default_factory=dict)
    # The same as a registry (bbstage.movers.Registry): what directives and preloads read.
    registry: movers.Registry = field(default_factory=movers.Registry)
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


def load(path: Path | str = DEFAULT_PATH) -> Config:
    """Read and check a config file; a missing file means all defaults."""
    return from_dict(read(path), source=str(path))


def from_dict(data: dict[str, Any], source: str = "<config>") -> Config:
    kwargs: dict[str, Any] = {}
    backends = convert(data.get("backends", {}), Backends, f"{source}: [backends]")
    kwargs["backends"] = tuple(backends.enabled)
    try:
        # The backends this file enables, a value the Config holds: the directive parser
        # and the forkserver's preloads are given it (config.registry), none reads a global.
        registry = movers.Registry(kwargs["backends"])
        tables = registry.tables()
    except movers.TransferError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    unknown = set(data) - {"daemon", "pools", "movers", "fairshare", "backends"} - set(tables)
    if unknown:
        hint = ""
        if unknown & set(movers.known_implementations):
            hint = " (a backend's table: add the backend to [backends] enabled)"
        raise ConfigError(f"{source}: unknown section(s) {sorted(unknown)}{hint}")
    daemon = convert(data.get("daemon", {}), Daemon, f"{source}: [daemon]")
    kwargs.update((k, v) for k, v in msgspec.structs.asdict(daemon).items() if v is not UNSET)
    pools = data.get("pools", [])
    if not isinstance(pools, list):
        raise ConfigError(f"{source}: [[pools]]: expected tables ([[pools]]), got a table")
    kwargs["pools"] = tuple(
        convert(raw, Pool, f"{source}: [[pools]] #{i + 1}") for i, raw in enumerate(pools)
    )
    deprecated: list[str] = []
    kwargs["movers"] = _movers(data.get("movers", {}), f"{source}: [movers]", deprecated)
    kwargs["fairshare"] = _fairshare(data.get("fairshare", {}), f"{source}: [fairshare]")
    # A typo in a backend's table is an error now, not at staging. The registry imports
    # the backends (~60 ms for S3) only here: config itself imports none.
    registry = registry.with_settings({t: data[t] for t in tables if t in data}, source, deprecated)
    kwargs["registry"] = registry
    kwargs["backend_settings"] = dict(registry.settings)
    kwargs["deprecated"] = tuple(deprecated)
    return Config(**kwargs)
