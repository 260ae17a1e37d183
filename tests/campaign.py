"""The fault campaign (issue [K]): a mixed staging workload on the real local cluster and RGW,
faults injected at random moments, and invariants I1-I7 checked on every job after each round.

Run it as ``scripts/fault-campaign --seed N --faults K [--slurm 24.11|26.05] [--json]`` (root, under
``flock /tmp/bbstage-cluster.lock``). docs/reliability.md says what it checks and how.

Jobs prove I1 themselves: each script hashes what was staged in (``sha256sum``) into
``ran/<tag>.in`` before it writes any output, and hashes its outputs into ``ran/<tag>.out``;
the checker compares the first with the sources' hashes taken at set-up, and every
stage-out destination (files, S3 objects read back) with the second.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bbstage import client
from bbstage.movers import checksum
from bbstage.movers.implementations import s3 as s3mover
from tests.s3env import S3Env, parse_exports
from tests.s3env import start as s3_start
from tests.s3fault import FaultProxy

REPO = Path(__file__).resolve().parents[1]
USER = "bbuser1"
PROFILE = "bbcampaign"
FINDINGS = Path("/tmp/campaign-findings.md")
TEMP = re.compile(r"^\..+\.bbstage-.+\.part$")  # a worker's temporary file
FAULTS = (
    "daemon_sigterm",
    "daemon_sigkill",
    "worker_sigkill",
    "slurmctld_restart",
    "enospc",
    "s3_5xx",
    "s3_reset",
    "marks_removed",
    "run_dir_wiped",
    "state_lost",
)
# Faults that matter most while a transfer runs: they wait (up to 4 s) for one to be in flight.
IN_FLIGHT = {"daemon_sigterm", "daemon_sigkill", "worker_sigkill", "run_dir_wiped", "state_lost"}
KINDS = ("tree", "file", "s3", "tmpfs")
ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}
TMPFS_SIZE = 48 << 20

# The job's own check (I1): a manifest of what was staged, in `sha256sum` format,
# `<sha>  <label>` for a file and `<sha>  <label>/<relative path>` for a tree.
SCRIPT_TAIL = r"""
set -u
T={tag}${{SLURM_ARRAY_TASK_ID:+_$SLURM_ARRAY_TASK_ID}}
R={w}/ran/$T
man() {{
  if [ -d "$2" ]; then
    (cd "$2" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum) \
      | sed "s#  \./#  $1/#"
  elif [ -f "$2" ]; then echo "$(sha256sum < "$2" | cut -d' ' -f1)  $1"
  else echo "MISSING  $1"; fi
}}
{{ {inputs}; }} > "$R.in.tmp" && mv "$R.in.tmp" "$R.in"
mkdir -p "$BB_SCRATCH/out/sub" {w}/res/$T
for i in 1 2 3; do
  head -c $(( (RANDOM % 768 + 1) * 1024 )) /dev/urandom > "$BB_SCRATCH/out/o$i"
done
head -c $(( RANDOM * 8 )) /dev/urandom > "$BB_SCRATCH/out/sub/s1"
head -c $(( (RANDOM % 512 + 1) * 1024 )) /dev/urandom > {w}/res/$T/result.dat
{{ man out "$BB_SCRATCH/out"; man res {w}/res/$T/result.dat; }} > "$R.out.tmp"
mv "$R.out.tmp" "$R.out"
"""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def tree_hashes(root: Path, label: str, pattern: str = "**/*") -> dict[str, tuple[str, int]]:
    return {
        f"{label}/{p.relative_to(root)}": (sha256(p), p.stat().st_size)
        for p in sorted(root.glob(pattern))
        if p.is_file()
    }


def chown(path: Path, user: str = USER) -> None:
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        shutil.chown(p, user, user)


def read_manifest(path: Path) -> dict[str, str] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    out = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        out[name] = digest
    return out


@dataclass
class Out:
    """A stage-out the checker verifies: manifest label, destination, whether from scratch."""

    label: str
    dest: str  # a path, a path ending in / (tree), or s3://bucket/key[/]
    scratch: bool
    stale: str | None = None  # sha256 of the stale file placed there (overwrite=always)


@dataclass
class In:
    """A stage-in destination outside scratch: every file there must be whole."""

    label: str
    dest: Path
    tree: bool
    stale: str | None = None


@dataclass
class Job:
    tag: str
    kind: str
    sid: str  # what Slurm commands take: "123" or "120_2"
    expected: dict[str, tuple[str, int]]  # input manifest entries -> (sha256, size)
    ins: list[In]
    outs: list[Out]
    round: int
    job_id: str = ""  # the real JobId (array tasks get their own)
    cancelled: bool = False
    info: dict[str, str] = field(default_factory=dict)
    outcome: str = ""
    why: list[str] = field(default_factory=list)


@dataclass
class Tally:
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    files: int = 0
    bytes: int = 0
    objects: int = 0
    violations: list[dict[str, Any]] = field(default_factory=list)
    missed: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0  # faults injected while a transfer's temporary file existed
    complete_kinds: Counter[str] = field(default_factory=Counter)  # complete jobs by kind

    def verified(self, size: int, s3: bool = False) -> None:
        self.files += 1
        self.bytes += size
        self.objects += int(s3)


class Campaign:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.version: str = args.slurm
        self.tally = Tally()
        self.jobs: list[Job] = []
        self.started = time.monotonic()
        self.cleanups: list[Any] = []
        self.round_faults: list[tuple[float, str]] = []
        self.seen: set[str] = set()
        self.kinds = args.kinds.split(",") if args.kinds else list(FAULTS)
        unknown = set(self.kinds) - set(FAULTS)
        if unknown:
            raise SystemExit(f"--kinds: unknown fault(s) {sorted(unknown)}: use {FAULTS}")

    # -- the cluster -----------------------------------------------------------------------

    def log(self, msg: str) -> None:
        t = time.monotonic() - self.started
        print(f"[fault-campaign {t:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def local_cluster(self, *args: str, timeout: float = 300) -> str:
        proc = subprocess.run(
            [str(REPO / "scripts" / "local-cluster"), *args, "--slurm", self.version],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode:
            raise RuntimeError(f"local-cluster {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
        return proc.stdout

    def run(self, *cmd: str, user: str | None = None, timeout: float = 60) -> tuple[int, str]:
        argv = ["runuser", "-u", user, "--", *cmd] if user else list(cmd)
        try:
            proc = subprocess.run(
                argv,
                env=self.env,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return 124, f"timed out: {' '.join(argv)}"
        return proc.returncode, proc.stdout if proc.returncode == 0 else proc.stderr

    def pid(self, name: str) -> int | None:
        try:
            return int((self.dir / "run" / f"{name}.pid").read_text())
        except (OSError, ValueError):
            return None

    def healthy(self) -> bool:
        return all(alive(self.pid(n)) for n in ("bbstage", "slurmctld", "slurmd"))

    def up(self) -> None:
        self.local_cluster("up", timeout=600)

    # -- set-up and clean-up ---------------------------------------------------------------

    def setup(self) -> None:
        self.env = parse_exports(self.local_cluster("up", timeout=1200))
        self.dir = Path(self.env["BBSTAGE_CLUSTER_DIR"])
        self.s3: S3Env = s3_start()
        self.w = self.dir / "campaign" / f"seed{self.args.seed}-{uuid.uuid4().hex[:6]}"
        self.w.mkdir(parents=True)
        (self.dir / "campaign").chmod(0o755)
        if not self.args.keep:
            self.cleanups.append(lambda: shutil.rmtree(self.w, ignore_errors=True))
        for sub in ("src/sub", "dst", "res", "out", "ran", "logs", "jobs", "tmpfs"):
            (self.w / sub).mkdir(parents=True)
        src = self.w / "src"
        rng = random.Random(self.args.seed)
        for i in range(6):
            (src / f"f{i:02}.dat").write_bytes(rng.randbytes(rng.randint(1, 1536) << 10))
        for i in range(8):
            (src / "sub" / f"g{i:02}.bin").write_bytes(rng.randbytes(rng.randint(0, 1024) << 10))
        (src / "big.bin").write_bytes(rng.randbytes(64 << 20))
        chown(self.w)
        self.src = {
            "tree": tree_hashes(src, "in"),
            "glob": tree_hashes(src, "glob", "*.dat"),
            "sub": tree_hashes(src / "sub", "sub"),
            "big": {"big": (sha256(src / "big.bin"), (src / "big.bin").stat().st_size)},
        }
        self._mount_tmpfs()
        self._s3_setup(rng)
        self.log(f"set up in {self.w} (Slurm {self.version}, S3 through {self.proxy.url})")

    def _mount_tmpfs(self) -> None:
        """A small file system as some jobs' destination: the enospc fault fills it."""
        point = self.w / "tmpfs"
        uid, gid = int(self._id("-u")), int(self._id("-g"))
        opts = f"size={TMPFS_SIZE},mode=0755,uid={uid},gid={gid}"
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "bbstage-campaign", str(point)], check=True
        )
        self.cleanups.append(lambda: umount(point))
        self.mounts = [point]
        if self.version != "22.05":
            # The root's bind mounts (24.11, 26.05) are private: show the job steps the same tmpfs.
            default = f"/var/tmp/bbstage-slurm-{self.version}-root"
            root = Path(os.environ.get("BBSTAGE_SLURM_ROOT", default))
            inner = Path(f"{root}{point}")
            subprocess.run(["mount", "--bind", str(point), str(inner)], check=True)
            self.cleanups.append(lambda: umount(inner))

    def _id(self, flag: str) -> str:
        return subprocess.run(["id", flag, USER], capture_output=True, text=True).stdout.strip()

    def _s3_setup(self, rng: random.Random) -> None:
        self.bucket = f"bbcampaign-{uuid.uuid4().hex[:10]}"
        self.s3.client(USER).create_bucket(Bucket=self.bucket)
        self.cleanups.append(lambda: self.s3.delete_bucket(self.bucket, USER))
        client = self.s3.client(USER)
        self.src["s3in"] = {}
        for i in range(8):
            body = rng.randbytes(rng.randint(1, 1024) << 10)
            client.put_object(Bucket=self.bucket, Key=f"in/o{i:02}", Body=body, Metadata=meta(body))
            self.src["s3in"][f"s3in/o{i:02}"] = (hashlib.sha256(body).hexdigest(), len(body))
        body = rng.randbytes(6 << 20)
        client.put_object(Bucket=self.bucket, Key="in/big.obj", Body=body, Metadata=meta(body))
        digest = (hashlib.sha256(body).hexdigest(), len(body))
        self.src["s3in"]["s3in/big.obj"] = digest
        self.src["bigobj"] = {"bigobj": digest}
        self.proxy = FaultProxy(self.s3.endpoint, seed=self.args.seed).start()
        self.cleanups.append(self.proxy.stop)
        # The users' profile names the proxy: the site allows it, or every S3 job is
        # refused by the endpoint allow-list and its faults test nothing.
        os.environ["BBSTAGE_S3_ALLOWED_EXTRA"] = self.proxy.url
        self.cleanups.append(lambda: os.environ.pop("BBSTAGE_S3_ALLOWED_EXTRA", None))
        self.up()
        self._profile()

    def _profile(self) -> None:
        """The user's own profile for the campaign's S3 directives, pointing at the proxy;
        the user's files are restored byte for byte at the end."""
        keys = self.s3.keys(USER)
        home = Path(os.path.expanduser(f"~{USER}")) / ".aws"
        home.mkdir(mode=0o700, exist_ok=True)
        shutil.chown(home, USER, USER)
        sections = {
            "config": f"\n[profile {PROFILE}]\nregion = us-east-1\n"
            f"endpoint_url = {self.proxy.url}\n",
            "credentials": f"\n[{PROFILE}]\naws_access_key_id = {keys.key}\n"
            f"aws_secret_access_key = {keys.secret}\n",
        }
        for name, text in sections.items():
            path = home / name
            before = path.read_bytes() if path.exists() else None
            self.cleanups.append(lambda p=path, b=before: restore(p, b))
            with path.open("ab") as f:
                f.write(text.encode())
            shutil.chown(path, USER, USER)
            path.chmod(0o600)

    def cleanup(self) -> None:
        self.proxy_reset()
        for job in self.jobs:
            if job.job_id and not job.info.get("_ended"):
                self.run("scancel", job.sid)
        for job in self.jobs:  # scratch the daemon kept for outputs that did not land
            if job.job_id:
                shutil.rmtree(self.dir / "scratch" / job.job_id, ignore_errors=True)
        for fn in reversed(self.cleanups):
            try:
                fn()
            except Exception as exc:  # any failure: log it and clean up the rest anyway
                self.log(f"clean-up step failed: {exc}")
        self.cleanups.clear()

    def proxy_reset(self) -> None:
        proxy = getattr(self, "proxy", None)
        if proxy is not None:
            proxy.slowdown = proxy.drop = proxy.truncate = 0.0

    # -- the workload ----------------------------------------------------------------------

    def make_job(self, kind: str, rnd: int, array: int = 0) -> list[Job]:
        tag = f"r{rnd:03}-{kind}-{uuid.uuid4().hex[:4]}"
        w, b, p = self.w, self.bucket, PROFILE
        ck = self.rng.choice(["", " checksum=xxh3", " checksum=blake2b"])
        lines: list[str] = []
        inputs: list[tuple[str, str]] = []
        expected: dict[str, tuple[str, int]] = {}
        ins: list[In] = []
        outs: list[Out] = []
        T = f"{tag}_%a" if array else tag
        if kind in ("tree", "array"):
            src = "sub" if array else "tree"
            lines += [
                f"stage_in source={w}/src/{'sub/' if array else ''} destination=$BB_SCRATCH/in/{ck}"
            ]
            inputs.append(("in", "$BB_SCRATCH/in"))
            expected |= {
                k.replace(f"{src}/", "in/", 1) if array else k: v for k, v in self.src[src].items()
            }
            if not array:
                lines.append(f"stage_in source={w}/src/*.dat destination=$BB_SCRATCH/glob/")
                inputs.append(("glob", "$BB_SCRATCH/glob"))
                expected |= self.src["glob"]
            lines.append(f"stage_out source=$BB_SCRATCH/out/ destination={w}/out/{T}/{ck}")
            outs.append(Out("out", f"{w}/out/{{T}}/", True))
        elif kind == "file":
            dst = w / "dst" / tag
            dst.mkdir()
            stale = self.rng.randbytes(1000)
            (dst / "big.bin").write_bytes(stale)
            os.utime(dst / "big.bin", (time.time() + 3600,) * 2)  # newer than the source
            (w / "out" / tag).mkdir()
            (w / "out" / tag / "result.dat").write_bytes(stale)
            chown(dst)
            chown(w / "out" / tag)
            old = hashlib.sha256(stale).hexdigest()
            lines += [
                f"stage_in source={w}/src/big.bin destination={dst}/big.bin"
                " checksum=xxh3 overwrite=always",
                f"stage_in source={w}/src/sub/ destination={dst}/sub/{ck}",
                f"stage_out source={w}/res/{tag}/result.dat destination={w}/out/{tag}/result.dat"
                " overwrite=always checksum=blake2b",
                f"stage_out source=$BB_SCRATCH/out/ destination={w}/out/{tag}/scr/",
            ]
            inputs += [("big", f"{dst}/big.bin"), ("sub", f"{dst}/sub")]
            expected |= self.src["big"] | self.src["sub"]
            ins += [In("big", dst / "big.bin", False, old), In("sub", dst / "sub", True)]
            outs += [
                Out("res", f"{w}/out/{{T}}/result.dat", False, old),
                Out("out", f"{w}/out/{{T}}/scr/", True),
            ]
        elif kind == "s3":
            dst = w / "dst" / tag
            lines += [
                f"stage_in source=s3://{b}/in/ destination=$BB_SCRATCH/s3in/ profile={p}{ck}",
                f"stage_in source=s3://{b}/in/big.obj destination={dst}/big.obj profile={p}",
                f"stage_out source=$BB_SCRATCH/out/ destination=s3://{b}/out/{tag}/ profile={p}",
                f"stage_out source={w}/res/{tag}/result.dat"
                f" destination=s3://{b}/res/{tag}/result.dat profile={p}{ck}",
            ]
            inputs += [("s3in", "$BB_SCRATCH/s3in"), ("bigobj", f"{dst}/big.obj")]
            expected |= self.src["s3in"] | self.src["bigobj"]
            ins.append(In("bigobj", dst / "big.obj", False))
            outs += [
                Out("out", f"s3://{b}/out/{{T}}/", True),
                Out("res", f"s3://{b}/res/{{T}}/result.dat", False),
            ]
        elif kind == "tmpfs":
            dst = w / "tmpfs" / tag
            lines += [
                f"stage_in source={w}/src/sub/ destination={dst}/in/{ck}",
                f"stage_out source=$BB_SCRATCH/out/ destination={dst}/out/",
            ]
            inputs.append(("in", f"{dst}/in"))
            expected |= {k.replace("sub/", "in/", 1): v for k, v in self.src["sub"].items()}
            ins.append(In("in", dst / "in", True))
            outs.append(Out("out", f"{dst}/out/", True))
        script = "\n".join(
            [
                "#!/bin/bash",
                f"#SBATCH --job-name=bbfc-{tag}",
                f"#SBATCH --output={w}/logs/{tag}-%j.out",
                "#SBATCH --time=10",
                "#BB_LUA pool=scratch capacity=128M",
                *(f"#BB_LUA {line}" for line in lines),
                SCRIPT_TAIL.format(
                    tag=tag, w=w, inputs="; ".join(f'man {lb} "{pa}"' for lb, pa in inputs)
                ),
            ]
        )
        path = w / "jobs" / f"{tag}.sh"
        path.write_text(script)
        path.chmod(0o644)
        argv = ["sbatch", "--parsable", f"--chdir={w}"]
        if array:
            argv.append(f"--array=0-{array - 1}")
        rc, out = self.run(*argv, str(path), user=USER)
        if rc:
            raise RuntimeError(f"sbatch {path} failed: {out}")
        sid = out.strip().split(";")[0]
        tasks = [(f"{sid}_{a}", f"{tag}_{a}") for a in range(array)] if array else [(sid, tag)]
        jobs = []
        for task_sid, t in tasks:
            task_outs = [Out(o.label, o.dest.replace("{T}", t), o.scratch, o.stale) for o in outs]
            jobs.append(Job(t, kind, task_sid, expected, ins, task_outs, rnd))
        return jobs

    # -- faults ----------------------------------------------------------------------------

    def inject(self, kind: str) -> bool:
        """Inject one fault; False if it could not be (no worker to kill)."""
        if kind in ("daemon_sigterm", "daemon_sigkill", "run_dir_wiped", "state_lost"):
            pid = self.pid("bbstage")
            sig = signal.SIGTERM if kind == "daemon_sigterm" else signal.SIGKILL
            if kind == "run_dir_wiped":
                sig = self.rng.choice([signal.SIGTERM, signal.SIGKILL])
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                wait_dead(pid, 60)
            if kind == "run_dir_wiped":
                run = self.dir / "run"
                for name in ("control.sock", "user.sock", "bbstage.pid"):
                    with contextlib.suppress(FileNotFoundError):
                        (run / name).unlink()
                shutil.rmtree(run / "staged", ignore_errors=True)
            if kind == "state_lost":  # the database is gone (a new disk, a bad restore)
                for p in (self.dir / "bbstage").glob("state.db*"):
                    p.unlink()
            self.local_cluster("restart-daemon", timeout=120)
            return True
        if kind == "worker_sigkill":
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                workers = worker_pids(self.pid("bbstage"))
                if workers:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.rng.choice(workers), signal.SIGKILL)
                    return True
                time.sleep(0.1)
            return False
        if kind == "slurmctld_restart":
            pid = self.pid("slurmctld")
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                wait_dead(pid, 60)
            self.up()
            return True
        if kind == "enospc":
            point = self.w / "tmpfs"
            st = os.statvfs(point)
            free = st.f_bavail * st.f_frsize
            fd = os.open(point / ".filler", os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                with contextlib.suppress(OSError):
                    os.posix_fallocate(fd, 0, max(free - 4096, 4096))
            finally:
                os.close(fd)
            return True
        if kind == "s3_5xx":
            self.proxy.slowdown = 0.3
            return True
        if kind == "s3_reset":
            self.proxy.drop = 0.2
            return True
        if kind == "marks_removed":
            marks = self.dir / "run" / "staged"
            for p in marks.glob("*"):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            return True
        raise ValueError(kind)

    def in_flight(self, wait: float) -> bool:
        """Wait until a transfer is under way (a job staging in or out, as the daemon says);
        False after ``wait`` seconds. Only the campaign's jobs run: it holds the lock."""
        deadline = time.monotonic() + wait
        sock = self.dir / "run" / "user.sock"
        while time.monotonic() < deadline:
            with contextlib.suppress(client.DaemonError):
                jobs = client.call(sock, "jobs", timeout=2.0)
                if any(j["state"] in ("staging_in", "staging_out") for j in jobs):
                    return True
            time.sleep(0.02)
        return False

    def end_faults(self) -> None:
        self.proxy_reset()
        with contextlib.suppress(FileNotFoundError):
            (self.w / "tmpfs" / ".filler").unlink()

    # -- rounds ----------------------------------------------------------------------------

    def round(self, rnd: int, faults: list[str]) -> None:
        kinds = self.rng.sample(KINDS, 3)
        if any(f.startswith("s3_") for f in faults) and "s3" not in kinds:
            kinds[0] = "s3"
        if "enospc" in faults and "tmpfs" not in kinds:
            kinds[1] = "tmpfs"
        if not self.healthy():
            self.log("a component is down before the round: local-cluster up")
            self.up()
        jobs: list[Job] = []
        for kind in kinds:
            jobs += self.make_job(kind, rnd)
        if rnd % 3 == 0:
            jobs += self.make_job("array", rnd, array=3)
        self.jobs += jobs
        t0 = time.monotonic()
        # Faults that bite while data moves come early (stage-in starts at once) and then
        # wait for a transfer; the others at any moment of the round.
        plan = sorted((self.rng.uniform(0.0, 4.0 if f in IN_FLIGHT else 6.0), f) for f in faults)
        cancel_at = self.rng.uniform(0.5, 8.0) if self.rng.random() < 0.3 else None
        if cancel_at is not None:
            plan = sorted([*plan, (cancel_at, "cancel")])
        done: list[str] = []
        for at, what in plan:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            if what == "cancel":
                victim = self.rng.choice(jobs)
                victim.cancelled = True
                self.run("scancel", victim.sid)
                done.append(f"scancel {victim.sid}@{time.monotonic() - t0:.1f}s")
                continue
            hit = ""
            if what in IN_FLIGHT and self.in_flight(wait=4.0):
                hit = "!"  # a transfer was running
                self.tally.in_flight += 1
            t = time.monotonic() - t0
            try:
                ok = self.inject(what)
                took = time.monotonic() - t0 - t
            except (RuntimeError, subprocess.SubprocessError) as exc:
                self.log(f"fault {what} failed: {exc}; bringing the cluster up")
                self.up()
                ok, took = True, time.monotonic() - t0 - t
            if ok:
                self.tally.faults[what] += 1
                took_s = f"(+{took:.1f}s)" if took >= 0.5 else ""
                done.append(f"{what}{hit}@{t:.1f}s{took_s}")
            else:
                self.tally.missed[what] += 1
        if any(f in ("s3_5xx", "s3_reset") for f in faults):
            time.sleep(max(0.0, t0 + 10 - time.monotonic()))  # a window of S3 faults
            self.proxy_reset()
        self.wait(jobs, timeout=self.args.round_timeout)
        self.end_faults()
        if self.args.sabotage and rnd == 0:
            self.sabotage(jobs)
        for job in jobs:
            self.check(job, done)
        for job in jobs:  # free the small file system for the next rounds
            shutil.rmtree(self.w / "tmpfs" / job.tag.rsplit("_", 1)[0], ignore_errors=True)
        counts = Counter(j.outcome for j in jobs)
        self.log(
            f"round {rnd}: {', '.join(done) or 'no fault'}; {len(jobs)} jobs: "
            + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        )

    def scontrol(self) -> dict[str, dict[str, str]]:
        rc, out = self.run("scontrol", "-o", "show", "job", timeout=30)
        records: dict[str, dict[str, str]] = {}
        if rc:
            return records
        for line in out.splitlines():
            fields: dict[str, str] = {}
            for k, v in re.findall(r"(\w+)=(\S*)", line):
                fields.setdefault(k, v)
            m = re.search(r"SystemComment=(.*?) \w+=", line)
            if m:  # free text: the hooks' errors, each with its date
                fields["SystemComment"] = m.group(1)
            records[fields.get("JobId", "")] = fields
            task = fields.get("ArrayTaskId", "")
            if task.isdigit():
                records[f"{fields.get('ArrayJobId')}_{task}"] = fields
        return records

    def wait(self, jobs: list[Job], timeout: float) -> None:
        """Until every job has ended (and its burst buffer is torn down) or is held; held
        jobs are cancelled (their answer is the hold) and waited for once more."""
        deadline = time.monotonic() + timeout
        cancelled_held: set[str] = set()
        while True:
            records = self.scontrol()
            pending = []
            for job in jobs:
                info = records.get(job.sid)
                if info is None:
                    pending.append(job)
                    continue
                job.info = dict(info) | {"_held": job.info.get("_held", "")}
                job.job_id = info.get("JobId", job.job_id)
                state = info.get("JobState", "")
                bb = info.get("BurstBufferState", "")
                if state in ENDED and bb in ("", "complete", "teardown-complete"):
                    job.info["_ended"] = "1"
                    continue
                reason = info.get("Reason", "")
                comment = info.get("SystemComment", "")
                if "burst_buffer" in reason.lower() + comment and (
                    info.get("Priority") == "0" or requeued(info)
                ):
                    # Held or requeued by Slurm after a hook failed: the hook's error says why.
                    why = reason if "burst_buffer" in reason.lower() else comment
                    job.info["_held"] = f"{reason}: {why}".replace("_", " ")
                    if job.sid not in cancelled_held:
                        self.run("scancel", job.sid)
                        cancelled_held.add(job.sid)
                pending.append(job)
            if not pending:
                return
            if time.monotonic() > deadline:
                for job in pending:
                    job.info["_timeout"] = "1"
                return
            if not self.healthy():
                self.log("a component died: local-cluster up")
                with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                    self.up()
            time.sleep(0.5)

    def sabotage(self, jobs: list[Job]) -> None:
        """Break one job's results on purpose, after it ended: the checker must see it
        (``--sabotage``, for the campaign's own tests; never in a real run)."""
        job = next(j for j in jobs if any(o.dest.startswith("/") for o in j.outs))
        out = next(o for o in job.outs if o.dest.startswith("/") and o.dest.endswith("/"))
        dest = Path(out.dest)
        kind = self.args.sabotage
        if kind == "temp":
            dest.mkdir(parents=True, exist_ok=True)
            (dest / f".o1.bbstage-{job.job_id}-deadbeef.part").write_bytes(b"partial")
        elif kind == "torn":
            with contextlib.suppress(FileNotFoundError), (dest / "o1").open("r+b") as f:
                f.truncate(f.seek(0, os.SEEK_END) // 2)
        elif kind == "scratch":
            (dest / "o1").unlink(missing_ok=True)
            shutil.rmtree(self.dir / "scratch" / job.job_id, ignore_errors=True)
        elif kind == "input":
            ran = self.w / "ran" / f"{job.tag}.in"
            text = ran.read_text() if ran.exists() else "0"
            ran.write_text(("0" if text[0] != "0" else "1") + text[1:])
        self.log(f"sabotage {kind}: job {job.sid} ({job.kind}), {dest}")

    # -- the checks ------------------------------------------------------------------------

    def status(self, job_id: str) -> dict[str, Any] | None:
        """``bbstage status --json`` (exit 1 means "staging failed": the JSON is there)."""
        try:
            proc = subprocess.run(
                ["bbstage", "status", "--json", job_id],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            return json.loads(proc.stdout) if proc.returncode in (0, 1) else None
        except (subprocess.TimeoutExpired, json.JSONDecodeError):
            return None

    def check(self, job: Job, faults: list[str]) -> None:
        bad: list[str] = []
        info = job.info
        state = info.get("JobState", "?")
        st = self.status(job.job_id) if job.job_id else None
        rows = {d["destination"].rstrip("/"): d for d in (st or {}).get("directives", [])}
        if info.get("_timeout") and state not in ENDED and not info.get("_held"):
            bad.append(
                f"I5: no answer after {self.args.round_timeout:.0f} s: JobState={state}"
                f" Reason={info.get('Reason')} BurstBufferState={info.get('BurstBufferState')}"
            )
        # I1: what the job saw when it ran.
        ran = read_manifest(self.w / "ran" / f"{job.tag}.in")
        if ran is not None:
            missing = sorted(k for k in job.expected if k not in ran)
            wrong = sorted(k for k in job.expected if k in ran and ran[k] != job.expected[k][0])
            extra = sorted(k for k in ran if k not in job.expected)
            if missing or wrong or extra:
                bad.append(
                    f"I1: ran with inputs that differ from the sources: missing {missing[:4]},"
                    f" differing {wrong[:4]}, unexpected {extra[:4]}"
                )
            else:
                for _, size in job.expected.values():
                    self.tally.verified(size)
        elif state == "COMPLETED":
            bad.append("I5: Slurm says COMPLETED but the script never recorded its inputs")
        # I3: stage-in destinations outside scratch hold whole files or none.
        for d in job.ins:
            want = {
                k.split("/", 1)[1] if "/" in k else "": v
                for k, v in job.expected.items()
                if k == d.label or k.startswith(d.label + "/")
            }
            bad += check_files(d.dest, d.tree, want, d.stale, "stage-in")
            row = rows.get(str(d.dest))
            if row and row["state"] == "done" and not self.whole(d.dest, d.tree, want, count=False):
                bad.append(f"I2: stage-in to {d.dest} says done but it is not the source")
        # Stage-outs: each destination is what the job wrote, or absent/untouched with the
        # outputs kept in scratch, and the job says why.
        outputs = read_manifest(self.w / "ran" / f"{job.tag}.out")
        unknown: set[str] = set()
        if outputs is None and job.cancelled:
            outputs, unknown = left_behind(
                self.w / "res" / job.tag / "result.dat", self.dir / "scratch" / job.job_id / "out"
            )
        outputs = outputs or {}
        unverified = []
        for o in job.outs:
            if o.label in unknown:
                if not o.dest.startswith("s3://"):
                    bad += check_files(Path(o.dest), o.dest.endswith("/"), None, None, "stage-out")
                continue
            want = {
                k.split("/", 1)[1] if "/" in k else "": (v, 0)
                for k, v in outputs.items()
                if k == o.label or k.startswith(o.label + "/")
            }
            if o.dest.startswith("s3://"):
                problems, ok = self.check_s3(o.dest, want)
            else:
                tree = o.dest.endswith("/")
                problems = check_files(Path(o.dest), tree, want, o.stale, "stage-out")
                ok = not problems and self.whole(Path(o.dest), tree, want)
            bad += problems
            row = rows.get(o.dest.rstrip("/"))
            if outputs and not ok:
                unverified.append(o)
                if row is not None and row.get("state") == "done":
                    bad.append(
                        f"I2: stage-out to {o.dest} says done but the destination"
                        " does not hold what the job wrote"
                    )
        scratch = self.dir / "scratch" / job.job_id if job.job_id else None
        if unverified and any(o.scratch for o in unverified) and outputs:
            want = {k.split("/", 1)[1]: v for k, v in outputs.items() if k.startswith("out/")}
            kept = scratch is not None and all(
                (scratch / "out" / rel).is_file() and sha256(scratch / "out" / rel) == digest
                for rel, digest in want.items()
            )
            if not kept:
                bad.append(
                    "I4: outputs did not all reach their destination and scratch "
                    f"{scratch} no longer holds them"
                )
        complete = state == "COMPLETED" and ran is not None and bool(outputs) and not unverified
        slurm_reason = info.get("Reason", "").replace("_", " ")
        if "burst buffer" not in slurm_reason.lower():
            slurm_reason = ""  # e.g. "None": Slurm does not say why
        reason = info.get("_held") or (st or {}).get("error") or slurm_reason
        if complete and st is not None and st.get("state") not in ("done", "staged_out"):
            reason = reason or f"bbstage state {st.get('state')}"
        if not bad and not complete:
            if job.cancelled and state == "CANCELLED":
                reason = reason or "cancelled by the campaign"
            if not reason and state != "CANCELLED":
                bad.append(
                    f"I7: ended {state} (bbstage: {(st or {}).get('state')}) without saying why"
                )
            elif not reason:
                reason = "CANCELLED"
        job.why = bad
        job.info["_reason"] = reason
        if self.args.verbose and not complete:
            self.log(f"  job {job.sid} ({job.kind}) {state}: {reason or bad}")
        job.outcome = "VIOLATION" if bad else ("complete" if complete else "clearly-failed")
        if job.cancelled:
            self.tally.outcomes["cancelled-by-campaign"] += 1
        self.tally.outcomes[job.outcome] += 1
        if job.outcome == "complete":
            self.tally.complete_kinds[job.kind] += 1
        if bad:
            self.violation(job, faults, bad, st)

    def whole(
        self, dest: Path, tree: bool, want: dict[str, tuple[str, int]], count: bool = True
    ) -> bool:
        if not want:
            return False
        for rel, (digest, _) in want.items():
            p = dest / rel if tree else dest
            if not p.is_file() or p.is_symlink() or sha256(p) != digest:
                return False
        for rel in want if count else ():
            p = dest / rel if tree else dest
            self.tally.verified(p.stat().st_size)
        return True

    def check_s3(self, url: str, want: dict[str, tuple[str, int]]) -> tuple[list[str], bool]:
        bucket, _, key = url[5:].partition("/")
        client = self.s3.client(USER)
        if url.endswith("/"):
            listed = client.list_objects_v2(Bucket=bucket, Prefix=key).get("Contents", [])
            found = {o["Key"][len(key) :]: o["Key"] for o in listed}
        else:
            found = {}
            with contextlib.suppress(Exception):
                client.head_object(Bucket=bucket, Key=key)
                found = {"": key}
        bad = []
        ok = bool(want)
        for rel, k in found.items():
            body = client.get_object(Bucket=bucket, Key=k)["Body"].read()
            if rel not in want:
                bad.append(f"I3: unexpected object s3://{bucket}/{k}")
            elif hashlib.sha256(body).hexdigest() != want[rel][0]:
                bad.append(f"I3: s3://{bucket}/{k} differs from what the job wrote")
            else:
                self.tally.verified(len(body), s3=True)
        if set(want) - set(found):
            ok = False
        return bad, ok and not bad

    def violation(
        self, job: Job, faults: list[str], bad: list[str], st: dict[str, Any] | None
    ) -> None:
        entry = {
            "job": job.sid,
            "job_id": job.job_id,
            "kind": job.kind,
            "round": job.round,
            "faults": faults,
            "slurm": {k: job.info.get(k) for k in ("JobState", "Reason", "BurstBufferState")},
            "bbstage": (st or {}).get("state"),
            "bbstage_error": (st or {}).get("error"),
            "violations": bad,
        }
        self.tally.violations.append(entry)
        self.log(f"VIOLATION job {job.sid} ({job.kind}): {'; '.join(bad)}")
        sig = "|".join(sorted({b.split(":")[0] + ":" + _shape(b) for b in bad}))
        sig += "|" + ",".join(sorted({f.split("@")[0] for f in faults}))
        if self.args.sabotage or sig in self.seen or _recorded(sig):
            return
        self.seen.add(sig)
        log = self.dir / "log" / "bbstage.log"
        lines = []
        with contextlib.suppress(OSError):
            lines = [
                ln for ln in log.read_text(errors="replace").splitlines() if f'"{job.job_id}"' in ln
            ][-15:]
        with FINDINGS.open("a") as f:
            f.write(
                f"\n## {time.strftime('%H:%M:%S')} {bad[0].split(':')[0]} — job {job.sid}"
                f" ({job.kind}), Slurm {self.version}\n<!-- sig: {sig} -->\n\n"
                f"- faults in the round (seconds after submission): {', '.join(faults)}\n"
                f"- Slurm: {entry['slurm']}; bbstage: {entry['bbstage']}"
                f" ({entry['bbstage_error']})\n"
                + "".join(f"- {b}\n" for b in bad)
                + f"- reproduce: `flock /tmp/bbstage-cluster.lock scripts/fault-campaign"
                f" --seed {self.args.seed} --faults {self.args.faults} --slurm {self.version}`"
                f" (round {job.round})\n\n```\n" + "\n".join(lines) + "\n```\n"
            )

    # -- the whole run ---------------------------------------------------------------------

    def main(self) -> int:
        self.setup()
        injected = rnd = 0
        per = max(1, self.args.per_round)
        while injected < self.args.faults and rnd < 3 * self.args.faults + 3:
            if time.monotonic() - self.started > self.args.time_limit:
                self.log(f"time limit ({self.args.time_limit:.0f} s): no more rounds")
                break
            want = min(per, self.args.faults - injected)
            faults = [self.rng.choice(self.kinds) for _ in range(want)]
            before = sum(self.tally.faults.values())
            self.round(rnd, faults)
            injected += sum(self.tally.faults.values()) - before
            rnd += 1
            self.rounds = rnd
        self.rounds = rnd
        if not self.tally.outcomes.get("complete"):
            self.log("no job completed: the workload itself is broken")
            return 1
        # A kind of job that never completed tested nothing (say, every S3 job refused).
        if never := sorted({j.kind for j in self.jobs} - set(self.tally.complete_kinds)):
            self.log(f"no {', '.join(never)} job completed: the harness tests nothing of them")
            return 1
        return 1 if self.tally.violations else 0

    def result(self) -> dict[str, Any]:
        t = self.tally
        return {
            "seed": self.args.seed,
            "slurm": self.version,
            "rounds": getattr(self, "rounds", 0),
            "complete_jobs": t.outcomes.get("complete", 0),
            "complete_by_kind": dict(sorted(t.complete_kinds.items())),
            "seconds": round(time.monotonic() - self.started, 1),
            "faults": sum(t.faults.values()),
            "faults_by_kind": dict(sorted(t.faults.items())),
            "faults_missed": dict(t.missed),
            "faults_during_a_transfer": t.in_flight,
            "jobs": len(self.jobs),
            "outcomes": dict(t.outcomes),
            "files_verified": t.files,
            "bytes_verified": t.bytes,
            "s3_objects_read_back": t.objects,
            "violations": t.violations,
        }


def _shape(text: str) -> str:
    """A violation's text without paths and numbers: what stays the same across runs."""
    return re.sub(r"\S*/\S*|\d+", "_", text.split(":", 1)[-1])[:80]


def _recorded(sig: str) -> bool:
    try:
        return f"<!-- sig: {sig} -->" in FINDINGS.read_text()
    except OSError:
        return False


def check_files(
    dest: Path,
    tree: bool,
    want: dict[str, tuple[str, int]] | None,
    stale: str | None,
    what: str,
) -> list[str]:
    """Every file under a final name is one of ``want`` (or the stale file it replaces,
    or nothing yet); no temporary file is left. With ``want`` None (what the job wrote is
    not known), only the second."""
    bad = []
    parent = dest if tree else dest.parent
    if parent.is_dir():
        for p in parent.rglob("*"):
            if TEMP.match(p.name):
                bad.append(f"I3: {what} temporary file left: {p}")
    if want is None:
        return bad
    if tree:
        if not dest.is_dir():
            return bad
        for p in dest.rglob("*"):
            if not p.is_file() or TEMP.match(p.name):
                continue
            rel = str(p.relative_to(dest))
            if rel not in want:
                bad.append(f"I3: {what} unexpected file {p}")
            elif sha256(p) != want[rel][0]:
                bad.append(f"I3: {what} {p} differs from its source (torn?)")
    elif dest.is_file():
        digest = sha256(dest)
        if digest != want.get("", ("",))[0] and digest != stale:
            bad.append(f"I3: {what} {dest} is neither the source nor the old file (torn?)")
    return bad


def left_behind(res: Path, scratch: Path) -> tuple[dict[str, str], set[str]]:
    """What a job cancelled while it ran had written, in its manifest's form: the job never
    recorded it, and its stage-out copied what was there. The sources hold it still, the
    job being over: ``res`` and the ``out`` directory of its scratch, which the daemon keeps
    when the stage-out failed. Once the scratch is gone (the stage-out done), what the job
    wrote there is not known: the second value names such labels."""
    found = {"res": sha256(res)} if res.is_file() else {}
    if not scratch.is_dir():
        return found, {"out"}
    for p in sorted(scratch.rglob("*")):
        if p.is_file():
            found[f"out/{p.relative_to(scratch)}"] = sha256(p)
    return found, set()


def requeued(info: dict[str, str]) -> bool:
    """Slurm requeued the job after a hook failed (e.g. pre_run while the daemon was down): it
    waits (120 s) to run again; the hook's failure is its reason."""
    if info.get("JobState") != "PENDING":
        return False
    try:
        eligible = time.mktime(time.strptime(info.get("EligibleTime", ""), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return False
    return eligible > time.time() + 5


def meta(body: bytes) -> dict[str, str]:
    """The checksums bbstage stores with an upload, so that ``checksum=`` downloads verify."""
    out = {}
    for algorithm in ("xxh3", "blake2b"):
        h = checksum.new(algorithm)
        h.update(body)
        out[s3mover.checksum_key(algorithm)] = h.hexdigest()
    return out


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def wait_dead(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def worker_pids(daemon: int | None) -> list[int]:
    """The daemon's workers: non-root children of its forkserver."""
    if not daemon:
        return []
    out = []
    for stat in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            text = stat.read_text()
            fields = dict(re.findall(r"^(\w+):\s+(\S+)", text, re.M))
            if fields.get("Uid") == "0":
                continue
            ppid = int(fields.get("PPid", 0))
            parent = Path(f"/proc/{ppid}/status").read_text()
            if re.search(rf"^PPid:\s+{daemon}$", parent, re.M):
                out.append(int(stat.parent.name))
    return out


def umount(point: Path) -> None:
    subprocess.run(["umount", str(point)], check=False, capture_output=True)


def restore(path: Path, before: bytes | None) -> None:
    if before is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(before)


def table(r: dict[str, Any]) -> str:
    rows = [
        f"fault campaign: seed {r['seed']}, Slurm {r['slurm']}, {r['rounds']} rounds,"
        f" {r['seconds']:.0f} s",
        f"  {'faults injected':<28}{r['faults']:>12}",
        *(f"    {k:<26}{v:>12}" for k, v in r["faults_by_kind"].items()),
        f"    {'(during a transfer)':<26}{r['faults_during_a_transfer']:>12}",
        f"  {'jobs':<28}{r['jobs']:>12}",
        *(f"    {k:<26}{v:>12}" for k, v in sorted(r["outcomes"].items())),
        f"  {'files verified':<28}{r['files_verified']:>12}",
        f"  {'bytes verified':<28}{r['bytes_verified']:>12}",
        f"  {'S3 objects read back':<28}{r['s3_objects_read_back']:>12}",
        f"  {'violations':<28}{len(r['violations']):>12}",
    ]
    for v in r["violations"]:
        for text in v["violations"]:
            rows.append(f"    job {v['job']} ({v['kind']}, {', '.join(v['faults'])}): {text}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/fault-campaign",
        description="Inject faults into the local cluster under a staging workload and check"
        " invariants I1-I7 on every job (docs/reliability.md).",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=20, help="faults to inject [20]")
    parser.add_argument("--slurm", default="22.05", choices=("22.05", "24.11", "26.05"))
    parser.add_argument("--kinds", help="only these faults (comma-separated) [all]")
    parser.add_argument("--per-round", type=int, default=2, help="faults per round [2]")
    parser.add_argument(
        "--round-timeout",
        type=float,
        default=150.0,
        help="seconds a round's jobs may take to end [150]",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=480.0,
        help="start no round after this many seconds [480]: the lock is shared",
    )
    parser.add_argument("--json", action="store_true", help="results as JSON on stdout")
    parser.add_argument("-v", "--verbose", action="store_true", help="say why jobs failed")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument(
        "--sabotage",
        choices=("temp", "torn", "scratch", "input"),
        help="break one job's results after round 0 (tests that the checker sees it)",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root (it submits jobs as bbuser1 and mounts a tmpfs)")
    campaign = Campaign(args)

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        rc = campaign.main()
    except KeyboardInterrupt:
        campaign.log("interrupted: cleaning up")
        rc = 2
    finally:
        campaign.cleanup()
    result = campaign.result()
    print(table(result), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(result, indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
