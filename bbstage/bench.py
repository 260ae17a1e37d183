"""``bbstage bench``: stage a generated data set through the movers real jobs use, and time it.

The transfer runs through :func:`bbstage.worker.run` with a spec built like
``Engine._spec`` builds one (same planning, concurrency, movers, retries), in this process
— or, with ``as_user``, in a child process that has dropped to that user first, as the
daemon's workers do. Where both locations are POSIX, ``cp`` (``cp -r`` for a tree) and
``rsync -a`` (when installed) copy the same data in the same run, each to a fresh
destination, and the report gives our throughput over theirs.

Fairness: before every timed copy the previous destination is removed and ``sync`` runs;
with ``cache="drop"`` (the default when permitted: root and a writable
``/proc/sys/vm/drop_caches``) the page cache is dropped too, so every copy reads cold data;
otherwise every copy reads the source from a warm cache (it was just written). Nobody
fsyncs. Ours and cp swap places every other repetition; the report gives medians.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bbstage import movers, worker
from bbstage.config import Config, parse_size
from bbstage.movers import MoverOptions

MB = 1_000_000  # throughput is reported in MB/s = 10^6 bytes per second
PER_DIR = 1000  # generated files per directory
SAMPLE_EVERY = 0.1  # seconds between throughput samples
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


class BenchError(Exception):
    """The benchmark cannot run as asked; the message says why and what to do."""


@dataclass
class Location:
    """Where the benchmark writes: a local directory or an ``s3://bucket/prefix``."""

    text: str

    @property
    def kind(self) -> str:
        return "s3" if self.text.startswith("s3://") else "posix"

    def join(self, *parts: str) -> str:
        return "/".join([self.text.rstrip("/"), *parts])


@dataclass
class Plan:
    """What to generate: ``files`` files of ``file_size`` bytes."""

    files: int
    file_size: int

    @property
    def total(self) -> int:
        return self.files * self.file_size


def plan_sizes(files: int | None, file_size: str | int | None, total: str | int | None) -> Plan:
    """Any two of files / file size / total determine the third (defaults: 1000 × 1M)."""
    size = parse_size(file_size) if file_size is not None else None
    whole = parse_size(total) if total is not None else None
    if files is not None and size is not None and whole is not None:
        if files * size != whole:
            raise BenchError("--files × --file-size must equal --total (or give only two)")
    if files is None:
        if whole is not None and size is not None:
            files = max(1, whole // max(size, 1))
        elif whole is not None:
            files = 1000 if whole >= 1000 * 4096 else 1
        else:
            files = 1000
    if size is None:
        size = whole // files if whole is not None else 1 << 20
    if files < 1:
        raise BenchError("--files must be at least 1")
    return Plan(files, size)


# -- data set ------------------------------------------------------------------------------


def generate(root: str, plan: Plan) -> str:
    """Write the data set under ``root``; return the path to stage (a file, or a tree ``/``)."""
    os.makedirs(root, exist_ok=True)
    block = os.urandom(min(max(plan.file_size, 1), 4 << 20))
    if plan.files == 1:
        path = os.path.join(root, "data.bin")
        _write(path, plan.file_size, block, 0)
        return path
    data = os.path.join(root, "data")
    for i in range(plan.files):
        sub = os.path.join(data, f"d{i // PER_DIR:04d}")
        if i % PER_DIR == 0:
            os.makedirs(sub, exist_ok=True)
        _write(os.path.join(sub, f"f{i:07d}"), plan.file_size, block, i)
    return data + "/"


def _write(path: str, size: int, block: bytes, seed: int) -> None:
    """``size`` bytes made of ``block``, each block stamped with (file, offset) so no two agree."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        done = 0
        while done < size:
            n = min(len(block), size - done)
            stamp = f"{seed}:{done}:".encode()[:n]
            os.write(fd, stamp + block[len(stamp) : n])
            done += n
    finally:
        os.close(fd)


# -- the transfer, as a job would run it ---------------------------------------------------


class BenchReporter:
    """The worker's progress sink: counts bytes and files, times each file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes = self.files = 0
        self.planned: tuple[int, int] | None = None
        self.latencies: list[float] = []
        self.temps: list[str] = []

    def send(self, *event: Any) -> None:
        if event and event[0] == "plan":
            self.planned = (int(event[1]), int(event[2]))

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.bytes += nbytes

    def file_done(self, seconds: float | None = None) -> None:
        with self._lock:
            self.files += 1
            if seconds is not None:
                self.latencies.append(seconds)

    def temp(self, path: str) -> None:
        self.temps.append(path)

    def flush(self) -> None:
        pass


def make_spec(
    source: str,
    destination: str,
    source_kind: str,
    destination_kind: str,
    config: Config,
    *,
    tree: bool,
    checksum: str = "none",
    profile: str | None = None,
) -> dict[str, Any]:
    """A transfer spec as ``Engine._spec`` builds it for a directive."""
    return {
        "job_id": f"bench-{os.getpid()}",
        "source": source,
        "destination": destination,
        "source_kind": source_kind,
        "destination_kind": destination_kind,
        "tree": tree,
        "glob": False,
        "checksum": checksum,
        "overwrite": "always",
        "threads": config.threads_per_transfer,
        "chunk_size": config.chunk_size,
        "extra": {"s3": config.s3, "profile": profile},
    }


@dataclass
class Run:
    """One timed copy."""

    seconds: float
    bytes: int
    files: int
    latencies: list[float] = field(default_factory=list)
    samples: list[tuple[float, int, int]] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else math.inf

    @property
    def files_per_s(self) -> float:
        return self.files / self.seconds if self.seconds > 0 else math.inf


def run_transfer(spec: dict[str, Any], expect: Plan, show: Callable[..., Any] | None) -> Run:
    """Run ``worker.run(spec)`` in a thread, sampling progress every SAMPLE_EVERY seconds."""
    reporter, cancel = BenchReporter(), threading.Event()
    failure: list[BaseException] = []

    def target() -> None:
        try:
            worker.run(spec, reporter, cancel)
        except BaseException as exc:  # reported below, in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=target, name="bench-transfer", daemon=True)
    samples: list[tuple[float, int, int]] = [(0.0, 0, 0)]
    start = time.perf_counter()
    thread.start()
    try:
        while thread.is_alive():
            thread.join(SAMPLE_EVERY)
            samples.append((time.perf_counter() - start, reporter.bytes, reporter.files))
            if show:
                show(reporter.bytes, reporter.files)
    except KeyboardInterrupt:
        cancel.set()
        thread.join()
        raise
    seconds = time.perf_counter() - start
    samples[-1] = (seconds, reporter.bytes, reporter.files)
    if failure:
        raise failure[0]
    if reporter.files != expect.files or reporter.bytes != expect.total:
        raise BenchError(
            f"the transfer copied {reporter.files} files / {reporter.bytes} bytes, "
            f"expected {expect.files} / {expect.total}"
        )
    return Run(seconds, reporter.bytes, reporter.files, reporter.latencies, samples)


def run_command(argv: list[str], expect: Plan) -> Run:
    """Time a baseline command."""
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return Run(seconds, expect.total, expect.files)


# -- cache policy --------------------------------------------------------------------------


def can_drop_caches() -> bool:
    return os.geteuid() == 0 and os.access(DROP_CACHES, os.W_OK)


def settle(cache: str) -> None:
    """Before a timed copy: flush dirty data; drop the page cache when asked; then wait
    for the disks to go idle (a removed destination's discards, the journal), so that no
    copy pays for the one before it."""
    os.sync()
    if cache == "drop":
        DROP_CACHES.write_text("3\n")
    wait_for_idle_disks()


def wait_for_idle_disks(quiet: float = 0.3, limit: float = 10.0) -> None:
    """Return once no block device has done any I/O for ``quiet`` seconds (or after ``limit``).
    Uses the busy-time counters of /proc/diskstats; returns at once where it is unreadable."""

    def busy() -> str | None:
        try:
            with open("/proc/diskstats") as f:
                return " ".join(line.split()[12] for line in f if len(line.split()) > 12)
        except OSError:
            return None

    deadline = time.monotonic() + limit
    last = busy()
    while last is not None and time.monotonic() < deadline:
        time.sleep(quiet)
        now = busy()
        if now == last:
            return
        last = now


# -- the benchmark -------------------------------------------------------------------------


def percentiles(values: list[float]) -> dict[str, float] | None:
    """p50/p90/p99/max/mean of ``values`` (seconds) in milliseconds."""
    if not values:
        return None
    ms = sorted(v * 1e3 for v in values)

    def pick(q: float) -> float:
        return ms[min(len(ms) - 1, max(0, math.ceil(q * len(ms)) - 1))]

    return {
        "p50": pick(0.50),
        "p90": pick(0.90),
        "p99": pick(0.99),
        "max": ms[-1],
        "mean": statistics.fmean(ms),
    }


def _median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.seconds)[(len(runs) - 1) // 2]


def _summary(runs: list[Run]) -> dict[str, Any]:
    mid = _median_run(runs)
    return {
        "seconds": mid.seconds,
        "mb_per_s": mid.mb_per_s,
        "files_per_s": mid.files_per_s,
        "runs": [
            {"seconds": r.seconds, "mb_per_s": r.mb_per_s, "files_per_s": r.files_per_s}
            for r in runs
        ],
    }


@dataclass
class Options:
    source: str
    destination: str
    plan: Plan
    repeat: int = 1
    baselines: bool = True
    cache: str = "auto"  # auto | drop | warm
    keep: bool = False
    checksum: str = "none"
    profile: str | None = None
    config: Config = field(default_factory=Config)
    progress: bool = True


def baseline_commands(src: str, work: str, tree: bool) -> dict[str, Callable[[], list[str]]]:
    """cp and (when installed) rsync, each into its own fresh destination under ``work``."""
    commands: dict[str, Callable[[], list[str]]] = {}
    if tree:
        commands["cp"] = lambda: ["cp", "-r", src.rstrip("/"), os.path.join(work, "cp")]
    else:
        commands["cp"] = lambda: ["cp", src, os.path.join(work, "cp")]
    if shutil.which("rsync"):
        dst = os.path.join(work, "rsync") + ("/" if tree else "")
        commands["rsync"] = lambda: ["rsync", "-a", src, dst]
    return commands


def bench(opts: Options) -> dict[str, Any]:
    """Generate, stage (and time the baselines), clean up; return the result dict."""
    src_loc, dst_loc = Location(opts.source), Location(opts.destination)
    if src_loc.kind == "s3" or dst_loc.kind == "s3":
        return _bench_s3(opts, src_loc, dst_loc)
    for loc in (src_loc, dst_loc):
        if not os.path.isabs(loc.text):
            raise BenchError(f"{loc.text}: give an absolute path (or s3://bucket/prefix)")
        if not os.path.isdir(loc.text):
            raise BenchError(f"{loc.text}: no such directory (create it first)")
    cache = opts.cache
    if cache == "auto":
        cache = "drop" if can_drop_caches() else "warm"
    elif cache == "drop" and not can_drop_caches():
        raise BenchError(f"cannot drop caches: {DROP_CACHES} is not writable (run as root)")
    tag = f"bbstage-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    src_root, work = src_loc.join(tag), dst_loc.join(tag)
    plan = opts.plan
    with _cleanup([src_root, work], opts.keep), _progress(opts.progress, plan) as bar:
        bar.phase("generating")
        source = generate(src_root, plan)
        os.makedirs(work, exist_ok=True)
        tree = source.endswith("/")
        ours_dst = os.path.join(work, "bbstage") + ("/" if tree else "")
        spec = make_spec(
            source,
            ours_dst,
            "posix",
            "posix",
            opts.config,
            tree=tree,
            checksum=opts.checksum,
            profile=opts.profile,
        )
        commands = baseline_commands(source, work, tree) if opts.baselines else {}
        contenders = ["bbstage", *commands]
        runs: dict[str, list[Run]] = {name: [] for name in contenders}
        if commands and opts.repeat > 1:
            # The first copy after the data was written runs slow for whoever comes first
            # (a 4 GiB copy took 15-16 s instead of 5-7): one untimed copy for nobody.
            bar.phase("warm-up (untimed)")
            _clear(work)
            settle(cache)
            run_command(next(iter(commands.values()))(), plan)
        for rep in range(opts.repeat):
            for name in run_order(contenders, rep):
                _clear(work)
                settle(cache)
                bar.phase(f"{name} ({rep + 1}/{opts.repeat})")
                if name == "bbstage":
                    runs[name].append(run_transfer(spec, plan, bar.update))
                else:
                    runs[name].append(run_command(commands[name](), plan))
            _clear(work)
    ours = _median_run(runs["bbstage"])
    result: dict[str, Any] = {
        "source": opts.source,
        "destination": opts.destination,
        "mover": movers.registry[("posix", "posix")],
        "files": plan.files,
        "file_size": plan.file_size,
        "total_bytes": plan.total,
        "threads": opts.config.threads_per_transfer,
        "chunk_size": opts.config.chunk_size,
        "checksum": opts.checksum,
        "cache": cache,
        "repeat": opts.repeat,
        **_summary(runs["bbstage"]),
        "latency_ms": percentiles(ours.latencies),
        "samples": [list(s) for s in ours.samples],
        "baselines": {},
        "environment": environment(),
    }
    for name in commands:
        base = _summary(runs[name])
        base["command"] = {"cp": "cp -r" if tree else "cp", "rsync": "rsync -a"}[name]
        base["ratio"] = base["seconds"] / result["seconds"] if result["seconds"] > 0 else None
        result["baselines"][name] = base
    return result


def _bench_s3(opts: Options, src: Location, dst: Location) -> dict[str, Any]:
    """Upload (local → s3://) or download (s3:// → local) through the S3 movers.

    The data set is generated in the local directory; a download first uploads it, untimed.
    No cp/rsync baseline applies (benchmarks/bench_s3.py compares with boto3's).
    """
    if src.kind == dst.kind:
        raise BenchError("one location must be a local directory and the other s3://bucket/prefix")
    local, remote = (src, dst) if src.kind == "posix" else (dst, src)
    if not os.path.isabs(local.text) or not os.path.isdir(local.text):
        raise BenchError(f"{local.text}: give an existing local directory")
    tag = f"bbstage-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    local_root, remote_root = local.join(tag), remote.join(tag)
    plan, upload = opts.plan, src.kind == "posix"
    s3_mover = movers.get("posix", "s3")(
        MoverOptions(extra={"s3": opts.config.s3, "profile": opts.profile})
    )
    try:
        with _cleanup([local_root], opts.keep), _progress(opts.progress, plan) as bar:
            bar.phase("generating")
            data = generate(os.path.join(local_root, "src"), plan)
            tree = data.endswith("/")
            name = "data/" if tree else "data.bin"
            remote_data = f"{remote_root}/{name}"
            local_dst = os.path.join(local_root, "dst", name)

            def spec(a: str, b: str) -> dict[str, Any]:
                kinds = ("posix", "s3") if a == data else ("s3", "posix")
                return make_spec(a, b, *kinds, opts.config, tree=tree, checksum=opts.checksum,
                                 profile=opts.profile)  # fmt: skip

            if not upload:
                bar.phase("uploading the data set")
                run_transfer(spec(data, remote_data), plan, None)
            runs = []
            for rep in range(opts.repeat):
                if upload:
                    s3_mover.remove(remote_data)
                else:
                    shutil.rmtree(os.path.join(local_root, "dst"), ignore_errors=True)
                bar.phase(f"bbstage ({rep + 1}/{opts.repeat})")
                transfer = spec(data, remote_data) if upload else spec(remote_data, local_dst)
                runs.append(run_transfer(transfer, plan, bar.update))
    finally:
        if not opts.keep:
            s3_mover.remove(remote_root)
        s3_mover.close()
    ours = _median_run(runs)
    pair = ("posix", "s3") if upload else ("s3", "posix")
    return {
        "source": opts.source,
        "destination": opts.destination,
        "mover": movers.registry[pair],
        "files": plan.files,
        "file_size": plan.file_size,
        "total_bytes": plan.total,
        "checksum": opts.checksum,
        "cache": "n/a",
        "repeat": opts.repeat,
        **_summary(runs),
        "latency_ms": percentiles(ours.latencies),
        "samples": [list(s) for s in ours.samples],
        "baselines": {},
        "environment": environment(),
    }


def run_order(contenders: list[str], rep: int) -> list[str]:
    """The order of one repetition: ours and the first baseline (cp) swap places every
    other repetition, the other baselines (rsync) come last. So ours and cp each start a
    repetition, right after the slowest contender of the one before, equally often, and
    each follows the other equally often (a plain rotation put ours after rsync in 3 of 5)."""
    head, rest = contenders[:2], contenders[2:]
    return (head if rep % 2 == 0 else head[::-1]) + rest


def _clear(work: str) -> None:
    """Remove every destination under ``work`` (a fresh destination for each copy)."""
    for name in os.listdir(work):
        path = os.path.join(work, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


@contextmanager
def _cleanup(paths: list[str], keep: bool) -> Iterator[None]:
    try:
        yield
    finally:
        if not keep:
            for path in paths:
                shutil.rmtree(path, ignore_errors=True)


class _Bar:
    """A rich progress bar on stderr (or nothing)."""

    def __init__(self, progress: Any, plan: Plan) -> None:
        self._p, self._plan = progress, plan
        self._task = progress.add_task("", total=plan.total, files="") if progress else None

    def phase(self, name: str) -> None:
        if self._p is not None:
            self._p.update(self._task, description=name, completed=0, files="")

    def update(self, nbytes: int, nfiles: int) -> None:
        if self._p is not None:
            self._p.update(self._task, completed=nbytes, files=f"{nfiles}/{self._plan.files} files")


@contextmanager
def _progress(enabled: bool, plan: Plan) -> Iterator[_Bar]:
    if not enabled:
        yield _Bar(None, plan)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description:<22}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[files]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        yield _Bar(progress, plan)


def environment() -> dict[str, str]:
    """Where the numbers were measured."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu,
        "cpus": str(os.cpu_count()),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


# -- running as another user ---------------------------------------------------------------


def bench_as(opts: Options, user: str) -> dict[str, Any]:
    """Run :func:`bench` in a child process that has become ``user`` (as a worker does)."""
    import multiprocessing
    import pwd

    from bbstage.identity import Identity

    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise BenchError(f"--as-user {user}: no such user") from None
    if os.geteuid() != 0:
        raise BenchError("--as-user needs root")
    identity = Identity.of(pw.pw_uid, pw.pw_gid)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, opts, identity))
    proc.start()
    child.close()
    try:
        outcome = parent.recv()
    except EOFError:
        outcome = ("error", f"the benchmark process died (exit code {proc.exitcode})")
    proc.join()
    if outcome[0] == "error":
        raise BenchError(outcome[1])
    return outcome[1]


def _child(conn: Any, opts: Options, identity: Any) -> None:
    try:
        worker._become(identity)
        os.umask(0o022)
        if opts.cache == "auto":
            opts.cache = "warm"  # the user cannot drop caches
        conn.send(("ok", bench(opts)))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}" if not _ours(exc) else str(exc)))
    finally:
        conn.close()


def _ours(exc: Exception) -> bool:
    return isinstance(exc, BenchError | movers.TransferError)


# -- output --------------------------------------------------------------------------------


def render(result: dict[str, Any]) -> None:
    """Human-readable table on stdout."""
    from rich.console import Console
    from rich.table import Table

    size = _human(result["file_size"])
    title = f"{result['files']} × {size} ({_human(result['total_bytes'])})"
    table = Table(title=title)
    for col in ("", "MB/s", "files/s", "seconds", "ours ×"):
        table.add_column(col, justify="right" if col else "left")
    table.add_row(
        "bbstage",
        f"{result['mb_per_s']:.1f}",
        f"{result['files_per_s']:.0f}",
        f"{result['seconds']:.3f}",
        "",
    )
    for b in result["baselines"].values():
        table.add_row(
            b["command"],
            f"{b['mb_per_s']:.1f}",
            f"{b['files_per_s']:.0f}",
            f"{b['seconds']:.3f}",
            f"{b['ratio']:.2f}×",
        )
    console = Console()
    console.print(table)
    lat = result["latency_ms"]
    if lat:
        console.print(
            f"per-file latency (ms): p50 {lat['p50']:.2f}  p90 {lat['p90']:.2f}  "
            f"p99 {lat['p99']:.2f}  max {lat['max']:.2f}"
        )
    console.print(
        f"cache: {result['cache']}, threads {result['threads']}, "
        f"chunk {_human(result['chunk_size'])}, median of {result['repeat']}"
    )


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def require_matplotlib() -> Any:
    """The matplotlib module, or a BenchError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise BenchError(
            "--plot needs matplotlib: pip install 'bbstage[bench]' (or pip install matplotlib)"
        ) from None
    return matplotlib


def plot(result: dict[str, Any], path: str, title: str | None = None) -> None:
    """Throughput over time (MB/s, 0.5 s window) with the baselines' averages as lines."""
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    xs, ys = [], []
    window = 0.5
    j = 0
    for t, b, _files in samples[1:]:
        while samples[j + 1][0] < t - window:
            j += 1
        t0, b0 = samples[j][0], samples[j][1]
        if t > t0:
            xs.append(t)
            ys.append((b - b0) / MB / (t - t0))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(xs, ys, label="bbstage", color="tab:blue")
    ax.axhline(result["mb_per_s"], color="tab:blue", linestyle=":", label="bbstage mean")
    colors = {"cp": "tab:orange", "rsync": "tab:green"}
    for name, b in result["baselines"].items():
        ax.axhline(b["mb_per_s"], color=colors.get(name, "gray"), linestyle="--", label=name)
    ax.set_xlabel("seconds")
    ax.set_ylabel("MB/s")
    ax.set_ylim(bottom=0)
    ax.set_title(
        title or f"{result['files']} × {_human(result['file_size'])}: throughput over time"
    )
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: Any) -> int:
    """``bbstage bench`` (``args`` from the CLI parser)."""
    import json

    from bbstage import config as configmod

    try:
        cfg = configmod.load(args.config)
    except configmod.ConfigError as exc:
        print(f"bbstage: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        cfg = _replace(cfg, threads_per_transfer=args.threads)
    try:
        if args.plot:
            require_matplotlib()
        opts = Options(
            source=args.source,
            destination=args.destination,
            plan=plan_sizes(args.files, args.file_size, args.total),
            repeat=max(1, args.repeat),
            baselines=not args.no_baselines,
            cache=args.cache,
            keep=args.keep,
            checksum=args.checksum,
            config=cfg,
            progress=sys.stderr.isatty() and not args.quiet,
        )
        result = bench_as(opts, args.as_user) if args.as_user else bench(opts)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            render(result)
        if args.plot:
            plot(result, args.plot)
    except (BenchError, movers.TransferError, ValueError) as exc:
        print(f"bbstage bench: {exc}", file=sys.stderr)
        return 1
    return 0


def _replace(cfg: Config, **changes: Any) -> Config:
    import dataclasses

    return dataclasses.replace(cfg, **changes)
