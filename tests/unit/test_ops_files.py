"""What an admin watches, checked without a daemon: the build-info metric and the unit's
ordering (the live /metrics against the alert rules and the dashboard:
tests/test_ops_daemon.py)."""

from __future__ import annotations

import platform

from prometheus_client import REGISTRY

import bbstage
from bbstage.daemon import metrics


def test_build_info_names_bbstage_and_python_versions() -> None:
    assert metrics.BUILD is not None
    labels = {"version": bbstage.__version__, "python": platform.python_version()}
    assert REGISTRY.get_sample_value("bbstage_build_info", labels) == 1.0
