"""``bbstage validate script.sh [--json]``: check a batch script's #BB_LUA and #DW directives.

Uses the same grammar as slurm_bb_job_process (docs/directives.md), so a script that passes
here is accepted at submission. A staging line after the first command is a warning (Slurm
accepts the job but never stages it): printed to stderr, it does not change the exit code.
Exit codes: 0 valid, 1 directive errors, 2 unreadable file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from bbstage.directives import MAX_ERRORS, parse
from bbstage.movers import Registry

_UNITS = (("P", 2**50), ("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10))


def _printable(s: str) -> str:
    """Undo surrogateescape for display: invalid UTF-8 bytes become U+FFFD."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _quote(value: str) -> str:
    if value and not any(c in value for c in ' \t"\\'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _size(n: int) -> str:
    for unit, factor in _UNITS:
        if n % factor == 0:
            return f"{n // factor}{unit} ({n} bytes)"
    return f"{n} bytes"


def summary(result: dict[str, Any]) -> list[str]:
    """Human-readable lines describing what will be staged."""
    ds = result["directives"]
    lines = [f"{len(ds)} staging directive{'' if len(ds) == 1 else 's'}"]
    for d in ds:
        kind = "in " if d["verb"] == "stage_in" else "out"
        what = "tree" if d["tree"] else "glob" if d["glob"] else "file"
        opts = " ".join(f"{k}={v}" for k, v in d["options"].items())
        lines.append(
            f"  [{d['index']}] line {d['line']}: {kind} {what} {_quote(d['source'])} -> "
            f"{_quote(d['destination'])}  ({opts})"
        )
    pool = result["pool"] or "none"
    capacity = "none" if result["capacity"] is None else _size(result["capacity"])
    lines.append(f"pool: {pool}, capacity: {capacity}")
    if result["scratch_names"]:
        names = ", ".join("$" + n for n in result["scratch_names"])
        lines.append(f"scratch: $BB_SCRATCH, also {names}")
        lines.append(
            "#DW lines reach the hooks only where burst_buffer.conf has Directive=DW, or with "
            "a #BB_LUA line in the script (docs/install.md)"
        )
    return [_printable(line) for line in lines]


def run(
    path: str,
    as_json: bool,
    registry: Registry,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Validate ``path`` by the rules of ``registry`` (the site's backends: the config's);
    print a summary (or JSON) and return the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        print(f"bbstage validate: cannot read {path}: {e.strerror or e}", file=err)
        return 2
    result = parse(data.decode("utf-8", "surrogateescape"), registry)
    ok = not result["errors"]
    if not as_json:
        for w in result["warnings"]:
            print(f"{path}: warning: {_printable(w['message'])}", file=err)
    if as_json:
        print(json.dumps(result, indent=2), file=out)
        return 0 if ok else 1
    if not ok:
        for e in result["errors"]:
            print(f"{path}: {_printable(e['message'])}", file=err)
        if len(result["errors"]) >= MAX_ERRORS:
            print(f"{path}: stopped after {MAX_ERRORS} errors", file=err)
        return 1
    print(f"{path}: OK", file=out)
    for line in summary(result):
        print(line, file=out)
    return 0
