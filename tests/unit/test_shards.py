"""Shards (issue 16): a tree split across nodes. The shards of a tree partition its files
(every file in exactly one, every directory in all), together they stage the whole tree
byte for byte with manifests that sum to the tree, and a resumed shard sweeps only its own
temporary files (another shard may be copying beside it)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import cast

from bbstage.movers import FileTask, Mover
from bbstage.movers.localfs import temp_name
from bbstage.transfer import (
    Done,
    FileRange,
    Planned,
    TempFile,
    TempsSettled,
    TransferSpec,
    TreeShard,
    planning,
    worker,
)
from tests.helpers import Conn, make_tree, tree_digests

NO_MOVER = cast(Mover, None)  # local destinations only: the mover's store sweep is not asked


def files(n: int) -> list[FileTask]:
    return [FileTask(f"/s/d{i % 7}/f{i}", f"/d/d{i % 7}/f{i}", size=i) for i in range(n)]


def test_the_shards_of_a_plan_partition_its_files_and_each_has_every_directory() -> None:
    dirs = [FileTask(f"/s/d{i}", f"/d/d{i}", kind="dir") for i in range(7)]
    plan = dirs + files(1000)
    shares = [list(planning.only(plan, TreeShard(i, 3))) for i in range(3)]
    for share in shares:
        assert [t for t in share if t.kind == "dir"] == dirs
    got = sorted(t.dst for share in shares for t in share if t.kind == "file")
    assert got == sorted(t.dst for t in files(1000))  # each file once, none lost
    assert all(200 < sum(t.kind == "file" for t in share) < 470 for share in shares)
    assert list(planning.only(plan, None)) == plan
    assert list(planning.only(plan, TreeShard(0, 1))) == plan


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
    outcomes = [run(base.but(part=TreeShard(i, 3))) for i in range(3)]
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
    shard = TreeShard(1, 2)
    removed = planning.remove_stale_temps(NO_MOVER, tasks, "7", shard)
    left = set(map(str, dst.iterdir()))
    for i, path in enumerate(temps):
        assert (path in left) != planning.in_shard(str(dst / f"f{i}"), shard)
    assert removed == 40 - len(left) > 0
    assert planning.remove_stale_temps(NO_MOVER, tasks, "7") == len(left)  # unsharded: all of them
    assert not os.listdir(dst)


def test_the_shares_of_one_big_file_write_its_ranges_and_one_puts_it_in_place(
    area: Path,
) -> None:
    """One file's shares (``group`` set), in any order: the file whole, byte for byte, its
    mode and mtime, no temporary file left, manifests that add up to one file."""
    src = area / "big.dat"
    src.write_bytes(os.urandom((5 << 20) + 77))
    os.chmod(src, 0o640)
    os.utime(src, ns=(1_600_000_000_000_000_001, 1_600_000_000_000_000_001))
    dst = area / "out" / "big.dat"
    dst.parent.mkdir()
    base = TransferSpec.between(str(src), str(dst), job_id="7")
    outcomes = [run(base.but(part=FileRange(i, 3, "0000abcd", 1 << 20))) for i in (2, 0, 1)]
    for done, plan in outcomes:
        assert done.covers(plan) and 0 < done.bytes < src.stat().st_size
    assert sum(d.files for d, _ in outcomes) == 1
    assert sum(d.bytes for d, _ in outcomes) == src.stat().st_size
    assert dst.read_bytes() == src.read_bytes()
    st = dst.stat()
    assert (st.st_mode & 0o777, st.st_mtime_ns) == (0o640, 1_600_000_000_000_000_001)
    assert os.listdir(dst.parent) == ["big.dat"]
    # In place now: a second submission's shares find nothing to do.
    again = [run(base.but(part=FileRange(i, 3, "0000abce", 1 << 20))) for i in range(3)]
    assert all(d == Done(0, 0) for d, _ in again)


def test_a_file_under_the_range_size_is_copied_whole_by_share_0(area: Path) -> None:
    src = area / "small.dat"
    src.write_bytes(os.urandom(5000))
    dst = area / "small.out"
    base = TransferSpec.between(str(src), str(dst), job_id="7")
    outcomes = [run(base.but(part=FileRange(i, 2, "0000abcd", 1 << 20))) for i in (1, 0)]
    assert [d for d, _ in outcomes] == [Done(0, 0), Done(5000, 1)]
    assert dst.read_bytes() == src.read_bytes()


def test_a_resumed_share_sweeps_older_groups_and_keeps_its_own(area: Path) -> None:
    dst = area / "big.dat"
    old = [temp_name(str(dst), "7", "00000001"), temp_name(str(dst), "7", "00000001", ".r0of2")]
    live = [temp_name(str(dst), "7", "00000002"), temp_name(str(dst), "7", "00000002", ".r1of2")]
    for path in old + live:
        Path(path).write_bytes(b"partial")
    tasks = [FileTask("/s/big.dat", str(dst), size=10)]
    assert planning.remove_stale_temps(NO_MOVER, tasks, "7", FileRange(0, 2, "00000002")) == 2
    assert sorted(map(str, area.iterdir())) == sorted(live)


def test_a_share_tells_its_temporary_files_before_making_them_then_settles_them(
    area: Path,
) -> None:
    """So that a share killed or failed has them removed (its transfer fails: the next
    submission is a new group), and one that ended does not keep them."""
    src = area / "big.dat"
    src.write_bytes(os.urandom(3 << 20))
    dst = area / "big.out"
    spec = TransferSpec.between(str(src), str(dst), job_id="7")
    conn = Conn()
    share = spec.but(part=FileRange(0, 2, "0000abcd", 1 << 20))
    worker.transfer(share, worker.Reporter(conn), threading.Event())  # type: ignore[arg-type]
    told = [e.path for e in conn.events if isinstance(e, TempFile)]
    assert told == [
        temp_name(str(dst), "7", "0000abcd"),
        temp_name(str(dst), "7", "0000abcd", ".r0of2"),
    ]
    assert sorted(told) == sorted(
        p for e in conn.events if isinstance(e, TempsSettled) for p in e.paths
    )
    assert sorted(map(str, area.iterdir())) == sorted([str(src), *told])  # range 1 is to come
