"""The fault campaign's checker (tests/campaign.py) without a cluster: the manifest the job
scripts write parses to the keys the checker expects, and ``check_files`` reports a left
temporary file, a torn file and an unexpected file while it accepts whole files, the stale
file an unfinished ``overwrite=always`` leaves, and nothing at all."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from tests.campaign import SCRIPT_TAIL, check_files, read_manifest, tree_hashes


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
