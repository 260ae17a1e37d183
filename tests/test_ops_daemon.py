"""[V] What an admin watches, against a real daemon: `bbstage health`, the live /metrics
against every series the alert rules and the dashboard name, and the journald priority
prefix on the daemon's own log lines."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .hookharness import REPO, Daemon, area, staged_job, start_daemon

__all__ = ["area"]

ALERTS = REPO / "daemon" / "bbstage-alerts.yml"
DASHBOARD = REPO / "daemon" / "bbstage-dashboard.json"
# Sample names a family of each type exports (prometheus_client's text format).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "unknown": ("",),
}
# A metric name in PromQL: any of the daemon's own prefixes (label names never carry them).
NAME = re.compile(r"(?<![\w:])(?:bbstage|process|python)_[A-Za-z0-9_:]+")
PROMETHEUS_OWN = {"up"}  # recorded by Prometheus for each scrape, named as such in the files


@pytest.fixture
def staged(area: Path) -> Iterator[tuple[Daemon, int]]:
    yield from staged_job(area, "301")


def exported(text: str) -> set[str]:
    """Every sample name the page's families may carry, samples or not yet (a labelled
    counter nothing has counted yet has its # TYPE line only)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


def queries() -> dict[str, str]:
    """Every PromQL expression of the alert rules and the dashboard, by where it is."""
    out = {}
    for group in _yaml(ALERTS)["groups"]:
        for rule in group["rules"]:
            out[f"alert {rule['alert']}"] = rule["expr"]
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            out[f"variable {variable['name']}"] = variable["definition"]
    return out


def _yaml(path: Path) -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(path.read_text())


def test_every_series_the_rules_and_the_dashboard_name_is_exported(
    staged: tuple[Daemon, int],
) -> None:
    _, port = staged
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    names = exported(text)
    assert {"bbstage_build_info", "bbstage_transfer_stalls_total"} <= names
    missing = {}
    used = set()
    for where, expr in queries().items():
        found = set(NAME.findall(expr))
        # `up` only as Prometheus's own (a bare word elsewhere is a PromQL keyword or label).
        found |= {n for n in PROMETHEUS_OWN if re.search(rf"(?<![\w:]){n}\{{", expr)}
        assert found, f"{where}: no metric found in {expr!r}"
        used |= found
        if gone := found - names - PROMETHEUS_OWN:
            missing[where] = sorted(gone)
    assert not missing, f"not exported by the daemon: {missing}"
    # One rule per condition watched; every bbstage family is read by a panel or a rule.
    assert len([w for w in queries() if w.startswith("alert ")]) == 7
    families = {f.name for f in text_string_to_metric_families(text)}
    ours = {f for f in families if f.startswith("bbstage_") and not f.endswith("_created")}
    unread = {f for f in ours if not any(n.startswith(f) for n in used)}
    assert not unread, f"families no panel or rule reads: {unread}"


def test_health_of_a_real_daemon(staged: tuple[Daemon, int]) -> None:
    d, _ = staged
    ok = d.cli("health", "--timeout", "10")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    first, *rest = ok.stdout.splitlines()
    assert first.startswith("BBSTAGE OK - daemon answering, state and 1 pool(s) writable | ")
    assert [line.split(": ")[1] for line in rest] == ["daemon", "state", "pool scratch"]
    d.stop()
    down = d.cli("health", "--timeout", "5")
    assert down.returncode == 2, down.stdout
    assert down.stdout.startswith(
        f"BBSTAGE CRITICAL - daemon: staging daemon not reachable at {d.root}/run/user.sock"
    )


def test_a_daemon_on_the_journal_prefixes_each_line_with_its_priority(
    area: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its stderr is the stream $JOURNAL_STREAM names (a file here: this machine runs no
    systemd), as systemd starts the unit: every line starts with <N>, the JSON after it."""
    root = area / "d"
    root.mkdir()
    log = root / "daemon.log"  # start_daemon appends the daemon's stderr to this file
    log.touch()
    st = os.stat(log)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    d = start_daemon(root)
    try:
        lines = log.read_text().splitlines()
    finally:
        d.stop()
    records = {}
    for line in lines:
        match = re.match(r"<([2-7])>(\{.*)", line)
        assert match, line
        record = json.loads(match[2])
        records[record["event"]] = (int(match[1]), record["level"])
    assert records["daemon started"] == (6, "info")
