"""A live progress bar on stderr while the benchmark runs (or nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bbstage.bench.model import Plan


class Bar:
    """A rich progress bar on stderr (or nothing)."""

    def __init__(self, progress: Any, plan: Plan) -> None:
        self._p, self._plan = progress, plan
        self._task = progress.add_task("", total=plan.total, files="") if progress else None

    def phase(self, name: str) -> None:
        if self._p is not None:
            self._p.update(self._task, description=name, completed=0, files="")

    def update(self, nbytes: int, nfiles: int) -> None:
        if self._p is not None:
            self._p.update(self._task, completed=nbytes, files=f"{nfiles}/{self._plan.files} files")


@contextmanager
def progress_bar(enabled: bool, plan: Plan) -> Iterator[Bar]:
    if not enabled:
        yield Bar(None, plan)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description:<22}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[files]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        yield Bar(progress, plan)
