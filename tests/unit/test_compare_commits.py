"""benchmarks/compare_commits.py: how two commits' samples become a ratio and a verdict."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import compare_commits  # noqa: E402  (benchmarks/ is not a package)

FIG = "posix big (MB/s; baseline cp)"


def rounds(old: list[list[float]], new: list[list[float]]) -> list[dict[str, Any]]:
    """One round per pair of sample lists; the baseline runs at 100 in every invocation."""
    return [
        {"old": {FIG: (o, [100.0], "MB/s")}, "new": {FIG: (n, [100.0], "MB/s")}}
        for o, n in zip(old, new, strict=True)
    ]


def test_a_ratio_inside_each_commits_own_spread_is_within_noise() -> None:
    f = compare_commits.summarise(rounds([[90, 110], [100, 100]], [[95, 105], [102, 98]]))[FIG]
    assert f["old_median"] == 100 and f["new_median"] == 100 and f["ratio"] == 1
    assert f["noise"] == pytest.approx(0.1)  # old's samples: 90..110 around 100
    assert f["verdict"] == "within noise"
    assert f["ratio_vs_baseline"] == 1


def test_a_ratio_beyond_the_spread_and_every_round_slower_is_said() -> None:
    f = compare_commits.summarise(rounds([[100, 102], [98, 100]], [[80, 81], [79, 80]]))[FIG]
    assert f["ratio"] == pytest.approx(80 / 100)
    assert f["round_ratios"] == pytest.approx([80.5 / 101, 79.5 / 99])
    assert f["verdict"] == "slower (every round slower)"
