"""What an admin watches, checked without a daemon: the build-info metric, the unit's
ordering, the alert rules and the dashboard's PromQL by promtool (the live /metrics against
the series they name: tests/test_ops_daemon.py)."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import bbstage
from bbstage.daemon import metrics

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "daemon" / "bbstage.service"
ALERTS = REPO / "daemon" / "bbstage-alerts.yml"
DASHBOARD = REPO / "daemon" / "bbstage-dashboard.json"


def test_build_info_names_bbstage_and_python_versions() -> None:
    assert metrics.BUILD is not None
    labels = {"version": bbstage.__version__, "python": platform.python_version()}
    assert REGISTRY.get_sample_value("bbstage_build_info", labels) == 1.0


def _unit() -> dict[str, list[str]]:
    """The unit's [Unit] and [Service] settings: each key's values, space-separated lists
    split (systemd.unit(5): a list setting may be given more than once)."""
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).extend(value.split())
    return out


def test_the_unit_starts_after_remote_file_systems_and_munge() -> None:
    unit = _unit()
    assert {"remote-fs.target", "munge.service", "network.target"} <= set(unit["After"])
    assert "remote-fs.target" in unit["Wants"]
    assert "slurmctld.service" in unit["Before"]  # the hooks find it answering
    assert unit["SyslogLevelPrefix"] == ["yes"]  # the log lines' <N> read as priorities


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: apt-get install prometheus (scripts/local-cluster up)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_promtool_checks_the_alert_rules() -> None:
    out = _promtool("check", "rules", str(ALERTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout


def test_promtool_runs_the_alert_rules_unit_test() -> None:
    test = REPO / "tests" / "ops" / "bbstage-alerts-test.yml"
    out = _promtool("test", "rules", test.name, cwd=test.parent)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each panel's query as a recording rule's expression (the dashboard's
    $instance variable given a value, as Grafana does)."""
    dashboard = json.loads(DASHBOARD.read_text())
    rules = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$instance", ".*")
            rules.append({"record": f"panel:{panel['id']}:{target['refId']}", "expr": expr})
    assert len(rules) > 15
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = _promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
