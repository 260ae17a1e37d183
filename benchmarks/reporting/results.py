"""The results files the report renders: ``benchmarks/results/<name>.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common import RESULTS


def result_files() -> dict[str, Path]:
    """Every results file by benchmark name, in name order."""
    return {p.stem: p for p in sorted(RESULTS.glob("*.json"))}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
