"""A job the daemon lost: its temporary files are found from its script and removed as their
owner (I3 after a lost state)."""

from __future__ import annotations

import os
from pathlib import Path

from bbstage.daemon import leftovers
from bbstage.movers import Registry

NOBODY = 65534


def temp(
    directory: Path, name: str, job: str = "7", suffix: str = "", owner: int | None = None
) -> Path:
    path = directory / f".{name}.bbstage-{job}-0123abcd{suffix}.part"
    path.write_bytes(b"partial")
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def owned_dir(path: Path, owner: int) -> Path:
    path.mkdir()
    os.chown(path, owner, owner)
    return path


def test_places_are_the_local_destinations_of_both_verbs() -> None:
    script = (
        "#!/bin/bash\n"
        "#BB_LUA stage_in source=/data/in.bin destination=/home/u/in.bin\n"
        "#BB_LUA stage_in source=/data/tree/ destination=/home/u/tree/\n"
        "#BB_LUA stage_in source=/data/*.h5 destination=/home/u/h5/\n"
        "#BB_LUA stage_in source=/data/x destination=$BB_SCRATCH/x\n"
        "#BB_LUA stage_out source=$BB_SCRATCH/out/ destination=/results/out/\n"
    )
    assert leftovers.places(script, Registry()) == [
        ("/home/u", False),
        ("/home/u/tree/", True),
        ("/home/u/h5/", True),
        ("/results/out/", True),
    ]


def test_a_script_that_does_not_parse_names_no_place() -> None:
    assert (
        leftovers.places("#!/bin/bash\n#BB_LUA stage_in source=/a/ destination=/b\n", Registry())
        == []
    )


def test_find_takes_this_jobs_temporary_files_only(tmp_path: Path) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    mine = {
        temp(tmp_path, "in.bin"),
        temp(tmp_path / "sub" / "deeper", "f"),
        temp(tmp_path, "big", suffix=".r0of4"),  # a range's marker
    }
    temp(tmp_path, "other", job="70")  # another job's
    (tmp_path / "in.bin").write_bytes(b"whole")
    os.symlink("/etc/passwd", tmp_path / ".s.bbstage-7-0123abcd.part")  # never taken
    found = leftovers.find([(str(tmp_path), True)], "7")
    assert set(found) == {0} and set(found[0]) == {str(p) for p in mine}


def test_a_file_destination_reads_its_directory_only(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    top = temp(tmp_path, "in.bin")
    temp(tmp_path / "sub", "in.bin")
    assert leftovers.find([(str(tmp_path), False)], "7") == {0: [str(top)]}


def test_the_search_stops_at_its_limit(tmp_path: Path) -> None:
    for i in range(10):
        (tmp_path / f"f{i}").write_bytes(b"")
    temp(tmp_path, "late")
    assert leftovers.find([(str(tmp_path), True)], "7", limit=5) == {}
    assert len(leftovers.find([(str(tmp_path), True)], "7", limit=11)[0]) == 1


def test_a_missing_directory_is_no_error(tmp_path: Path) -> None:
    assert leftovers.find([(str(tmp_path / "gone"), True), (str(tmp_path / "x"), False)], "7") == {}


def test_files_are_removed_as_their_owner_never_as_root(area: Path) -> None:
    """nobody's file in nobody's directory goes; nobody's file in a directory only root may
    write stays (root could remove it); root's file stays (root is never assumed)."""
    theirs = owned_dir(area / "theirs", NOBODY)
    gone = temp(theirs, "a", owner=NOBODY)
    locked = area / "locked"
    locked.mkdir(mode=0o755)
    stays = temp(locked, "b", owner=NOBODY)
    roots = temp(theirs, "c")
    found = leftovers.find([(str(theirs), False), (str(locked), False)], "7")
    assert leftovers.remove(found, "7") == 1
    assert not gone.exists() and stays.exists() and roots.exists()


def test_sweep_finds_them_from_the_script_slurm_kept(area: Path) -> None:
    dest = owned_dir(area / "dest", NOBODY)
    part = temp(dest, "in.bin", owner=NOBODY)
    job = area / "script"
    job.write_bytes(f"#!/bin/bash\n#BB_LUA stage_in source=/a destination={dest}/in.bin\n".encode())
    assert leftovers.read(str(area / "no-script"), "7") is None
    assert leftovers.sweep(leftovers.read(str(job), "7") or "", "7", Registry()) == 1
    assert not part.exists()
