"""[V] The workers' cgroup: a burst of copies runs inside the memory and CPU bounds the admin
set ([movers] cgroups, memory_max, cpus), and the daemon, which answers Slurm's hooks, stays
outside them. The real daemon on this machine's kernel cgroups (v1 here; v2 where mounted),
plus the writing of the bounds on fake v1 and v2 trees."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bbstage import config
from bbstage.daemon import cgroups
from tests.helpers import file_digest
from tests.hookharness import area, script, start_daemon, user_ids, user_tree  # noqa: F401

MEMORY_MAX = 96 << 20


def fake(root: Path, *files: str) -> Path:
    root.mkdir(parents=True)
    for name in ("cgroup.procs", *files):
        (root / name).write_text("")
    return root


def test_bounds_are_written_in_v2_and_v1_files(tmp_path: Path) -> None:
    v2 = fake(tmp_path / "v2")
    v1mem, v1cpu = fake(tmp_path / "memory"), fake(tmp_path / "cpu")
    for d in (v2 / "w",):
        fake(d, "memory.max", "cpu.max")
    fake(v1mem / "w", "memory.limit_in_bytes")
    fake(v1cpu / "w", "cpu.cfs_quota_us", "cpu.cfs_period_us")
    bounds = cgroups.Bounds(memory_max=1 << 30, cpus=1.5)
    cgroups.prepare((v2 / "w",), bounds)
    assert (v2 / "w" / "memory.max").read_text() == str(1 << 30)
    assert (v2 / "w" / "cpu.max").read_text() == "150000 100000"
    cgroups.prepare((v1mem / "w", v1cpu / "w"), bounds)
    assert (v1mem / "w" / "memory.limit_in_bytes").read_text() == str(1 << 30)
    assert (v1cpu / "w" / "cpu.cfs_quota_us").read_text() == "150000"
    cgroups.enter((v1mem / "w", v1cpu / "w"), 4242)
    assert (v1cpu / "w" / "cgroup.procs").read_text() == "4242"


def test_a_bound_no_directory_can_hold_is_refused_naming_them(tmp_path: Path) -> None:
    cpu_only = fake(tmp_path / "cpu") / "w"
    fake(cpu_only, "cpu.max")
    with pytest.raises(cgroups.CgroupError, match=r"memory_max: none of .*cpu/w"):
        cgroups.prepare((cpu_only,), cgroups.Bounds(memory_max=1 << 20))
    with pytest.raises(cgroups.CgroupError, match="its parent is no cgroup"):
        cgroups.prepare((tmp_path / "nowhere" / "w",), cgroups.Bounds())


def test_bounds_without_a_cgroup_are_a_config_error() -> None:
    with pytest.raises(config.ConfigError, match="memory_max and cpus need cgroups"):
        config.from_dict({"movers": {"memory_max": "1G"}})
    got = config.from_dict({"movers": {"cgroups": ["/a", "/b"], "cpus": 2, "memory_max": "1G"}})
    assert got.movers.cgroups == (Path("/a"), Path("/b")) and got.movers.memory_max == 1 << 30


def own_cgroups() -> tuple[Path, ...]:
    """Where this process may make the workers' cgroup: v2 if it has the memory and cpu
    controllers, else v1's memory and cpu hierarchies."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:
        if line.startswith("0::"):
            base = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            controllers = base / "cgroup.controllers"
            if controllers.exists() and {"memory", "cpu"} <= set(controllers.read_text().split()):
                return (base,)
    found = {}
    for line in lines:
        _, names, where = line.split(":", 2)
        for name in ("memory", "cpu"):
            if name in names.split(","):
                found[name] = Path("/sys/fs/cgroup") / names / where.lstrip("/")
    assert set(found) == {"memory", "cpu"}, f"no memory and cpu cgroups here: {lines}"
    return found["memory"], found["cpu"]


@pytest.fixture
def workers_cgroup() -> Iterator[tuple[Path, ...]]:
    name = f"bbstage-test-{uuid.uuid4().hex[:8]}"
    made = tuple(base / name for base in own_cgroups())
    yield made
    for d in made:  # empty once the daemon and its workers are gone
        for pid in (d / "cgroup.procs").read_text().split() if d.exists() else ():
            os.kill(int(pid), 9)
        if d.exists():
            d.rmdir()


def test_a_copy_burst_runs_in_the_workers_cgroup_under_its_bound(
    area: Path,  # noqa: F811
    workers_cgroup: tuple[Path, ...],
) -> None:
    """Four jobs of 48 MiB each at once, with memory_max 96 MiB: every byte lands (hashed),
    the workers' memory (page cache included) never passed the bound, the workers were
    charged (they ran inside), and the daemon itself is not in the cgroup."""
    dirs = ", ".join(f'"{d}"' for d in workers_cgroup)
    d = start_daemon(
        area / "daemon",
        f'metrics_address = ""\n[movers]\ncgroups = [{dirs}]\n'
        f'memory_max = "{MEMORY_MAX}"\ncpus = 1',
    )
    try:
        uid, gid = user_ids()
        data = area / "data"
        data.mkdir()
        for i in range(4):
            (data / f"f{i}.dat").write_bytes(os.urandom(48 << 20))
        user_tree(data, uid, gid)
        (area / "out").mkdir()
        out = user_tree(area / "out", uid, gid)

        def stage(i: int) -> tuple[int, str]:
            job = script(area / f"job{i}.sh",
                         f"stage_in source={data}/f{i}.dat destination={out}/f{i}.dat")  # fmt: skip
            job_id = str(700 + i)
            assert d.hook("slurm_bb_setup", job_id, str(uid), str(gid), "(null)", "0", job)[0] == 0
            return d.hook("slurm_bb_data_in", job_id, job)

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(stage, range(4))) == [(0, "")] * 4
        for i in range(4):
            assert file_digest(out / f"f{i}.dat") == file_digest(data / f"f{i}.dat")
        memory = next(p for p in workers_cgroup if (p / "memory.limit_in_bytes").exists()
                      or (p / "memory.max").exists())  # fmt: skip
        if (memory / "memory.max_usage_in_bytes").exists():  # v1
            peak = int((memory / "memory.max_usage_in_bytes").read_text())
        else:
            peak = int((memory / "memory.peak").read_text())
        assert 0 < peak <= MEMORY_MAX  # charged: the workers ran inside; and bounded
        for group in workers_cgroup:
            assert str(d.proc.pid) not in (group / "cgroup.procs").read_text().split()
    finally:
        d.stop()
