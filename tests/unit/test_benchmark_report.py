"""benchmarks/report.py: docs/performance.md is what the committed results render to."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import common  # noqa: E402  (benchmarks/ is not a package: its modules import each other by name)
from reporting import document, plots, results  # noqa: E402

DOCS = common.REPO / "docs"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_document_is_what_the_results_render_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regenerating from benchmarks/results/ gives docs/performance.md and its figures byte
    for byte: nobody edited a generated section, and the report's code still writes it."""
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(plots, "IMG", tmp_path / "img")
    assert document.build(plots=True) == document.DOC.read_text()
    for png in sorted((tmp_path / "img").iterdir()):
        assert digest(png) == digest(DOCS / "img" / png.name), png.name


def test_a_broken_or_unknown_result_gets_a_generic_table_notes_are_kept_stale_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s3 = json.loads((common.RESULTS / "s3.json").read_text())
    del s3["results"]["big_upload"]["MBps"]
    (tmp_path / "s3.json").write_text(json.dumps(s3))
    (tmp_path / "extra.json").write_text(json.dumps({"title": "Extra", "n": {"x": 1.5}}))
    doc = tmp_path / "performance.md"
    doc.write_text(
        "# Performance\n\n## Extra\n\nold\n\n## Extra, best of 3 runs\n\n| a |\n\n"
        "Measured 2026-11-28 15:17 UTC on AMD EPYC (2 CPUs).\n\n"
        "## Notes by hand\n\nMeasured with a script.\n\nkept\n"
    )
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    monkeypatch.setattr(document, "DOC", doc)

    text = document.build(plots=False)

    err = capsys.readouterr().err
    assert "KeyError('MBps'); generic table instead" in err
    assert "dropped '## Extra, best of 3 runs'" in err and "best of 3" not in text
    assert "From `benchmarks/results/s3.json` (no dedicated renderer" in text
    assert "## Extra\n\nFrom `benchmarks/results/extra.json`" in text
    assert "| n.x | 1.5 |" in text and "old" not in text  # rendered anew, not kept
    assert text.endswith("## Notes by hand\n\nMeasured with a script.\n\nkept\n")


def test_a_ratio_that_misses_its_goal_never_reads_as_the_goal() -> None:
    from reporting.staging import shown

    assert shown(1.098, 1.1) == "1.098"  # two decimals would say 1.10 and "NOT met"
    assert shown(1.1, 1.1) == "1.10"
    assert shown(1.0949, 1.1) == "1.09"
    assert shown(1.3561, 1.1) == "1.36"
    assert shown(1.098, None) == "1.10"
