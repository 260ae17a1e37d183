"""Shards (issue 16): a tree split across nodes. The shards of a tree partition its files
(every file in exactly one, every directory in all), together they stage the whole tree
byte for byte with manifests that sum to the tree, and a resumed shard sweeps only its own
temporary files (another shard may be copying beside it)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from bbstage import planning, worker
from bbstage.movers import FileTask
from bbstage.movers.localfs import temp_name
from bbstage.transfer import Done, Planned, Shard, TransferSpec
from tests.helpers import Conn, make_tree, tree_digests


def files(n: int) -> list[FileTask]:
    return [FileTask(f"/s/d{i % 7}/f{i}", f"/d/d{i % 7}/f{i}", size=i) for i in range(n)]


def test_the_shards_of_a_plan_partition_its_files_and_each_has_every_directory() -> None:
    dirs = [FileTask(f"/s/d{i}", f"/d/d{i}", kind="dir") for i in range(7)]
    plan = dirs + files(1000)
    shares = [list(planning.only(plan, Shard(i, 3))) for i in range(3)]
    for share in shares:
        assert [t for t in share if t.kind == "dir"] == dirs
    got = sorted(t.dst for share in shares for t in share if t.kind == "file")
    assert got == sorted(t.dst for t in files(1000))  # each file once, none lost
    assert all(200 < sum(t.kind == "file" for t in share) < 470 for share in shares)
    assert list(planning.only(plan, None)) == plan
    assert list(planning.only(plan, Shard(0, 1))) == plan


def run(spec: TransferSpec) -> tuple[Done, Planned]:
    conn = Conn()
    worker.transfer(spec, worker.Reporter(conn), threading.Event())
    done = next(e for e in conn.events if isinstance(e, Done))
    plan = [e for e in conn.events if isinstance(e, Planned) and e.final][-1]
    return done, plan


def test_the_shards_of_a_tree_stage_it_whole_and_their_manifests_sum_to_it(area: Path) -> None:
    src = make_tree(area / "src", 300, 3000)
    (src / "empty").mkdir()
    base = TransferSpec.between(f"{src}/", f"{area / 'dst'}/", job_id="7")
    outcomes = [run(base.but(shard=Shard(i, 3))) for i in range(3)]
    for done, plan in outcomes:
        assert done.covers(plan) and 0 < done.files < 300
    assert sum(d.files for d, _ in outcomes) == 300
    assert sum(d.bytes for d, _ in outcomes) == sum(
        f.stat().st_size for f in src.rglob("*") if f.is_file()
    )
    assert tree_digests(area / "dst") == tree_digests(src)
    assert (area / "dst" / "empty").is_dir()


def test_a_resumed_shard_sweeps_only_its_own_temporary_files(area: Path) -> None:
    dst = area / "dst"
    dst.mkdir()
    temps = [temp_name(str(dst / f"f{i}"), "7") for i in range(40)]
    for path in temps:
        Path(path).write_bytes(b"partial")
    tasks = [FileTask(f"/s/f{i}", str(dst / f"f{i}")) for i in range(40)]
    shard = Shard(1, 2)
    removed = planning.remove_stale_temps(tasks, "7", shard)
    left = set(map(str, dst.iterdir()))
    for i, path in enumerate(temps):
        assert (path in left) != planning.in_shard(str(dst / f"f{i}"), shard)
    assert removed == 40 - len(left) > 0
    assert planning.remove_stale_temps(tasks, "7") == len(left)  # unsharded: all of them
    assert not os.listdir(dst)
