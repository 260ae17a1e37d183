"""What every ``benchmarks/bench_*.py`` does around its measurement: find the checkout,
parse the usual flags, store ``benchmarks/results/<name>.json``, regenerate
``docs/performance.md``, say where it ran, and stop with a message that names the script.

Importing this module puts the checkout first on ``sys.path``, so the scripts import
``bbstage`` (and ``tests``) from the tree they belong to, installed or not: import it
before them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RESULTS = REPO / "benchmarks" / "results"
REPORT = REPO / "benchmarks" / "report.py"


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser described by the script's docstring's first paragraph, with
    ``--no-doc`` (``benchmarks/run`` passes it: the report is written once, at the end)."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--no-doc", action="store_true", help="do not regenerate docs/performance.md")
    return ap


def result_path(name: str) -> Path:
    return RESULTS / f"{name}.json"


def load_result(name: str) -> dict[str, Any]:
    """The stored result of ``name``, or ``{}`` (to update one case of several)."""
    path = result_path(name)
    return json.loads(path.read_text()) if path.exists() else {}


def save_result(name: str, result: dict[str, Any], *, doc: bool = True) -> Path:
    """Write ``benchmarks/results/<name>.json``; then, if ``doc``, regenerate
    docs/performance.md from every result (benchmarks/report.py)."""
    path = result_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path.relative_to(REPO)}")
    if doc:
        subprocess.run([sys.executable, str(REPORT)], check=True)
    return path


def fail(message: str) -> NoReturn:
    """Stop the benchmark: ``bench_<name>: message`` on stderr, exit status 1."""
    sys.exit(f"{Path(sys.argv[0]).stem}: {message}")


def check(ok: bool, what: str) -> None:
    """:func:`fail` with ``what`` unless ``ok`` (a wrong answer voids the timing)."""
    if not ok:
        fail(what)


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action()`` took (wall clock)."""
    t0 = time.perf_counter()
    action()
    return time.perf_counter() - t0


def rotate(contenders: list[str], round_: int) -> list[str]:
    """The order of one round: each contender starts a round as often as the others, so a
    noisy neighbour or a warm cache favours nobody. (Each follows the same one in every
    round but the one it starts; for S3 that was measured not to matter: the store is idle
    before every copy, docs/performance.md.)"""
    k = round_ % len(contenders)
    return contenders[k:] + contenders[:k]


def first_line(argv: list[str]) -> str:
    """The first line a command prints (stdout, else stderr), white space folded; ``?``
    when it cannot run."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True)
    except OSError:
        return "?"
    lines = (proc.stdout or proc.stderr).splitlines()
    return " ".join(lines[0].split()) if lines else "?"


def lua_version() -> str:
    """``Lua 5.1.5``: the interpreter the hooks run under."""
    return " ".join(first_line(["lua5.1", "-v"]).split()[:2])


def environment(**extra: Any) -> dict[str, Any]:
    """Where the numbers were measured (``bbstage bench``'s fields), plus ``extra``."""
    from bbstage.bench import environment as machine

    return {**machine(), **extra}


@contextlib.contextmanager
def outputs_on_a_journal(work: Path, size: str = "24G") -> Iterator[tuple[Path, str]]:
    """Where the timed copies write (a directory, and how it is stored). ``work`` itself,
    unless it is on an ext4 without a journal (this project's VMs) and we are root: then
    an ext4 with a journal of its own, on a loop device made here and removed after. Without
    a journal, ext4 passes over every inode freed in the last minute when it allocates one
    (``recently_deleted``): a copy of 1,000 files right after another copy's 1,000 were
    removed cost rclone 0.63-0.87 s of system CPU, against 0.14-0.18 s with none removed
    before, which decided the small-file rows more than either client did."""
    if os.geteuid() != 0 or not _ext4_without_journal(work):
        yield work, "as is"
        return
    image, mount = work / "outputs.img", work / "outputs"
    mount.mkdir()
    subprocess.run(["truncate", "-s", size, str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    device = subprocess.run(
        ["losetup", "--direct-io=on", "--find", "--show", str(image)],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    try:
        subprocess.run(["mount", device, str(mount)], check=True)
        try:
            yield mount, "ext4 with a journal, on a loop device (the machine's has none)"
        finally:
            subprocess.run(["umount", str(mount)], check=False)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)
        image.unlink(missing_ok=True)


def _ext4_without_journal(path: Path) -> bool:
    found = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE,FSTYPE", "--target", str(path)],
        capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    if len(found) != 2 or found[1] != "ext4":
        return False
    return not list(Path("/proc/fs/jbd2").glob(os.path.basename(found[0]) + "-*"))
