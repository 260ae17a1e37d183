"""The real local cluster (scripts/local-cluster): slurmctld, slurmd, munge and the daemon."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bbstage.daemon.reconcile import HELD_FOR_A_KILLED_HOOK
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
USER, OTHER = "bbuser1", "bbuser2"


@dataclass
class Cluster:
    env: dict[str, str]
    dir: Path
    slurm: str = "22.05"

    def run(self, *cmd: str, user: str | None = None, check: bool = True) -> str:
        argv = ["runuser", "-u", user, "--", *cmd] if user else list(cmd)
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120)
        if check and proc.returncode:
            raise AssertionError(f"{shlex.join(argv)} -> {proc.returncode}\n{proc.stderr}")
        return proc.stdout

    def submit(self, workdir: Path, body: str, user: str = USER, check: bool = True) -> str:
        script = workdir / f"job-{uuid.uuid4().hex[:6]}.sh"
        script.write_text(body)
        script.chmod(0o644)
        out = self.run(
            "sbatch",
            "--parsable",
            f"--chdir={workdir}",
            f"--output={workdir}/slurm-%j.out",
            str(script),
            user=user,
            check=check,
        )
        return out.strip().split(";")[0]

    def sbatch_error(self, workdir: Path, body: str) -> str:
        script = workdir / "bad.sh"
        script.write_text(body)
        script.chmod(0o644)
        proc = subprocess.run(
            ["runuser", "-u", USER, "--", "sbatch", f"--chdir={workdir}", str(script)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode != 0, f"sbatch accepted a bad script: {proc.stdout}"
        return proc.stderr

    def job(self, job_id: str) -> dict[str, str]:
        out = self.run("scontrol", "show", "job", job_id, check=False)
        fields = dict(re.findall(r"(\w+)=(\S*)", out))
        # scontrol turns the reason's spaces into "_"; squeue shows it as the user sees it.
        reason = self.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%r", check=False)
        reason = reason.strip()
        if reason:
            fields["Reason"] = reason
        return fields

    def wait(
        self, job_id: str, pred: Callable[[dict[str, str]], bool], timeout: float = 120
    ) -> dict[str, str]:
        """Until ``pred`` holds of the job's fields (those fields); fails at once on a hold
        (but one the daemon releases)."""

        def met() -> dict[str, str] | None:
            info = self.job(job_id)
            if pred(info):
                return info
            # Held: PENDING with priority 0. A job cancelled during stage-in may also show a
            # hook's failure as its reason (26.05: test_data_in polled after the teardown).
            # A hold for a hook that "failed" with no message or BUSY is Slurm's own (it killed
            # the hook as it stopped): the daemon releases that job (reconcile.release_held).
            held = info.get("JobState") == "PENDING" and info.get("Priority") == "0"
            reason = info.get("Reason", "")
            killed = HELD_FOR_A_KILLED_HOOK.fullmatch(reason)
            if held and "burst_buffer/lua" in reason and not killed:
                raise AssertionError(f"job {job_id} held: {reason}")
            return None

        return wait_until(met, timeout, lambda: f"job {job_id}, in {self.job(job_id)}", every=0.2)

    def wait_state(self, job_id: str, *states: str, timeout: float = 120) -> dict[str, str]:
        return self.wait(job_id, lambda j: j.get("JobState") in states, timeout)

    def wait_gone(self, job_id: str, timeout: float = 120) -> None:
        """Until teardown ran: the job finished and its burst buffer is released."""
        self.wait(
            job_id,
            lambda j: (
                j.get("JobState") in ("COMPLETED", "CANCELLED", "FAILED")
                and j.get("BurstBufferState", "") in ("", "complete", "teardown-complete")
            ),
            timeout,
        )

    def status(self, job_id: str, user: str = USER) -> dict:
        # Exit code 1 means "staging failed": the JSON is still there.
        return json.loads(self.run("bbstage", "status", "--json", job_id, user=user, check=False))

    def bbstage(self, *args: str, user: str | None = USER) -> subprocess.CompletedProcess[str]:
        argv = ["runuser", "-u", user, "--"] if user else []
        return subprocess.run(
            [*argv, "bbstage", *args], env=self.env, capture_output=True, text=True, timeout=60
        )

    def daemon_pid(self) -> int:
        return int((self.dir / "run" / "bbstage.pid").read_text())

    def up(self) -> None:
        subprocess.run(
            [str(REPO / "scripts" / "local-cluster"), "up", "--slurm", self.slurm],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=600,
        )


# The Slurm generations (docs/slurm-versions.md), oldest first: 22.05 on the host, 24.11 and
# 26.05 chrooted into Debian 13 and sid roots. Their PATH puts the root's clients (wrappers)
# first, so the helpers above run the right sbatch/squeue/scontrol/scancel for each.
SLURM_VERSIONS = ("22.05", "24.11", "26.05")
OLDEST, NEWEST = SLURM_VERSIONS[0], SLURM_VERSIONS[-1]

# Which tests run on which generation (CI's 30 minutes; docs/slurm-versions.md, "Tests"):
# every test on the oldest and the newest supported generation, and on the ones between
# (24.11) only the modules marked ``every_generation``, a smoke subset that keeps their
# hook API covered. A test marked ``newest_only`` exercises no Slurm behaviour (a transfer
# node's death, a scheduler restart, TLS between bbstage and Dask): it runs on the newest
# generation only. BBSTAGE_EVERY_GENERATION=1 runs every test on every generation.
EVERY_GENERATION = os.environ.get("BBSTAGE_EVERY_GENERATION") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "every_generation: runs on every Slurm generation, not only oldest and newest"
    )
    config.addinivalue_line(
        "markers", "newest_only: exercises no Slurm behaviour; runs on the newest generation only"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (reported by pytest as deselected) the tests of a middle generation that
    are not marked ``every_generation``, and those marked ``newest_only`` but the newest's."""
    if EVERY_GENERATION:
        return
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        version = callspec.params.get("cluster") if callspec else None
        middle = version is not None and version not in (OLDEST, NEWEST)
        smoke = item.get_closest_marker("every_generation") is not None
        newest_only = item.get_closest_marker("newest_only") is not None
        older = version is not None and version != NEWEST
        (drop if (middle and not smoke) or (newest_only and older) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def local_cluster_up(
    *args: str, timeout: float = 1200, env: dict[str, str] | None = None
) -> dict[str, str]:
    """``scripts/local-cluster up ARGS`` (in ``env``, default this process's); the
    environment its ``export`` lines describe."""
    env = dict(os.environ if env is None else env)
    proc = subprocess.run(
        [str(REPO / "scripts" / "local-cluster"), "up", *args],
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, f"local-cluster up {' '.join(args)} failed (see its output)"
    for line in proc.stdout.splitlines():
        m = re.match(r"export (\w+)=(.*)", line)
        if m:
            value = m.group(2).replace('"$PATH"', os.environ.get("PATH", ""))
            env[m.group(1)] = shlex.split(value)[0] if value else ""
    return env


@pytest.fixture(scope="session", params=SLURM_VERSIONS)
def cluster(request: pytest.FixtureRequest) -> Cluster:
    version = request.param
    env = local_cluster_up("--slurm", version)
    return Cluster(env, Path(env["BBSTAGE_CLUSTER_DIR"]), version)


@pytest.fixture
def workdir(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A directory owned by the test user, traversable by the cluster."""
    name = re.sub(r"\W", "_", request.node.name)[:60]
    path = cluster.dir / "tests" / f"{name}-{uuid.uuid4().hex[:6]}"
    path.mkdir(parents=True)
    (cluster.dir / "tests").chmod(0o755)
    shutil.chown(path, USER, USER)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(path: Path, user: str = USER) -> Path:
    """chown a path (recursively) to the test user."""
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        shutil.chown(p, user, user)
    return path
