#!/usr/bin/env python3
"""Generate docs/performance.md (tables) and docs/img/perf-*.png (plots) from
benchmarks/results/*.json — the document is never edited by hand.

Each ``benchmarks/bench_*.py`` writes its JSON, then runs this script. Sections come in
the order of ``reporting.document.SECTIONS``; a results file with no renderer gets a generic
table of its numbers, and a ``## `` section of the current document that no results file
renders (the hand-written notes on what makes the difference, with the measurements behind
the code's choices) is kept as it is, at the end. The pieces live in ``benchmarks/reporting/``.

Usage: python3 benchmarks/report.py [--no-plots]
"""

from __future__ import annotations

import argparse
import sys

from common import REPO
from reporting.document import DOC, build


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-plots", action="store_true", help="tables only")
    args = ap.parse_args()
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(build(plots=not args.no_plots))
    print(f"wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
