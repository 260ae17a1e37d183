"""The fault campaign's checker (tests/campaign.py) without a cluster: the manifest the job
scripts write parses to the keys the checker expects, and ``check_files`` reports a left
temporary file, a torn file and an unexpected file while it accepts whole files, the stale
file an unfinished ``overwrite=always`` leaves, and nothing at all; and what a job cancelled
while it ran had written is read from its sources."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from tests.campaign import SCRIPT_TAIL, check_files, left_behind, read_manifest, tree_hashes


def make_tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.dat").write_bytes(b"alpha" * 1000)
    (root / "sub" / "b.bin").write_bytes(b"beta")
    (root / "sub" / "empty").write_bytes(b"")
    return root


def test_the_job_scripts_manifest_matches_the_source_hashes(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    man = re.search(r"^man\(\) \{\{\n.*?^\}\}\n", SCRIPT_TAIL, re.M | re.S).group(0)
    man = man.replace("{{", "{").replace("}}", "}")
    script = f'{man}man in "{src}"; man one "{src}/a.dat"; man gone "{tmp_path}/nothing"\n'
    out = tmp_path / "manifest"
    out.write_bytes(subprocess.run(["bash", "-c", script], capture_output=True).stdout)
    got = read_manifest(out)
    want = {k: v[0] for k, v in tree_hashes(src, "in").items()}
    want["one"] = hashlib.sha256(b"alpha" * 1000).hexdigest()
    want["gone"] = "MISSING"
    assert got == want


def test_check_files_reports_temp_torn_and_unexpected_files(tmp_path: Path) -> None:
    dest = make_tree(tmp_path / "dst")
    want = {k.split("/", 1)[1]: v for k, v in tree_hashes(dest, "x").items()}
    assert check_files(dest, True, want, None, "stage-in") == []

    (dest / ".a.dat.bbstage-42-0123abcd.part").write_bytes(b"alp")
    (dest / "sub" / "b.bin").write_bytes(b"be")
    (dest / "planted").write_bytes(b"?")
    problems = check_files(dest, True, want, None, "stage-in")
    assert any(p.startswith("I3: stage-in temporary file left") for p in problems), problems
    assert any("b.bin differs from its source" in p for p in problems), problems
    assert any("unexpected file" in p and "planted" in p for p in problems), problems


def test_a_single_file_may_be_the_source_the_stale_file_or_absent(tmp_path: Path) -> None:
    path = tmp_path / "out.dat"
    want = {"": (hashlib.sha256(b"new").hexdigest(), 3)}
    stale = hashlib.sha256(b"old").hexdigest()
    assert check_files(path, False, want, stale, "stage-out") == []
    for body, ok in ((b"new", True), (b"old", True), (b"ne", False)):
        path.write_bytes(body)
        assert (check_files(path, False, want, stale, "stage-out") == []) is ok, body


def test_a_job_cancelled_while_it_ran_is_checked_against_what_it_left(tmp_path: Path) -> None:
    """CI's campaign (seed 1, round 8): a job scancelled 0.4 s into its run had written
    ``o1`` and no manifest; its stage-out copied ``o1`` and the checker called it
    unexpected. The destination must hold what the kept scratch holds, byte for byte."""
    scratch = make_tree(tmp_path / "scratch" / "out")
    dest = make_tree(tmp_path / "dst")
    found, unknown = left_behind(tmp_path / "res" / "result.dat", scratch)
    assert unknown == set() and "res" not in found
    want = {k.split("/", 1)[1]: (v, 0) for k, v in found.items()}
    assert sorted(want) == ["a.dat", "sub/b.bin", "sub/empty"]
    assert check_files(dest, True, want, None, "stage-out") == []
    (dest / "a.dat").write_bytes(b"alp")
    assert any("a.dat differs" in p for p in check_files(dest, True, want, None, "stage-out"))

    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "result.dat").write_bytes(b"half")
    found, unknown = left_behind(tmp_path / "res" / "result.dat", tmp_path / "gone")
    assert found == {"res": hashlib.sha256(b"half").hexdigest()} and unknown == {"out"}
    (dest / ".a.dat.bbstage-42-0123abcd.part").write_bytes(b"alp")
    assert [p for p in check_files(dest, True, None, None, "stage-out")] == [
        f"I3: stage-out temporary file left: {dest / '.a.dat.bbstage-42-0123abcd.part'}"
    ]
