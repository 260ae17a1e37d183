"""[K] The fault campaign (scripts/fault-campaign, tests/campaign.py), short and seeded: at
least 20 faults injected into the real 22.05 cluster and RGW under a mixed workload, and not
one violation of I1-I7 on any job. The long run's figures are in docs/reliability.md."""

from __future__ import annotations

import json
import subprocess

import pytest

from .conftest import REPO

pytestmark = pytest.mark.cluster


def test_short_seeded_campaign_has_no_violation() -> None:
    proc = subprocess.run(
        [str(REPO / "scripts" / "fault-campaign"), "--seed", "1", "--faults", "20", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    print(proc.stderr[-6000:])
    assert result["faults"] >= 20, result["faults_by_kind"]
    assert result["files_verified"] > 0
    assert result["violations"] == [], json.dumps(result["violations"], indent=2)
    assert proc.returncode == 0
