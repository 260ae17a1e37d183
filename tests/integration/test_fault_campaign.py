"""[K] The fault campaign (scripts/fault-campaign, tests/campaign.py), short and seeded: at
least 20 faults injected into the real 22.05 cluster and RGW under a mixed workload, and not
one violation of I1-I7 on any job. The long run's figures are in docs/reliability.md.

The checker itself is tested too: ``--sabotage`` breaks one job's results after the first
round (a temporary file left, a torn output, outputs gone from both destination and scratch,
a job that ran with other inputs), and the campaign must report exactly that invariant."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from .conftest import REPO

pytestmark = pytest.mark.cluster


def campaign(*args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [str(REPO / "scripts" / "fault-campaign"), "--json", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_short_seeded_campaign_has_no_violation() -> None:
    rc, result, log = campaign("--seed", "1", "--faults", "20")
    print(log[-6000:])
    assert result["faults"] >= 20, result["faults_by_kind"]
    assert result["complete_jobs"] > 0 and result["files_verified"] > 0
    # Every kind of job completed at least once: none of them tests nothing (S3's objects
    # read back: refused by the endpoint allow-list, they once all "clearly failed").
    assert set(result["complete_by_kind"]) >= {"tree", "file", "s3", "tmpfs"}, result
    assert result["s3_objects_read_back"] > 0
    assert result["violations"] == [], json.dumps(result["violations"], indent=2)
    assert rc == 0


@pytest.mark.parametrize(
    ("sabotage", "invariant"),
    [("temp", "I3"), ("torn", "I3"), ("scratch", "I4"), ("input", "I1")],
)
def test_the_checker_sees_a_broken_result(sabotage: str, invariant: str) -> None:
    rc, result, log = campaign(
        "--seed", "7", "--faults", "1", "--kinds", "marks_removed", "--sabotage", sabotage
    )
    found = [text for v in result["violations"] for text in v["violations"]]
    assert rc == 1, log[-4000:]
    assert any(text.startswith(invariant) for text in found), found
