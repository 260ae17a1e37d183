"""Processes started for a user get an allow-listed environment, never root's (audit #5):
its owner can read ``/proc/<pid>/environ``, so root's keys and proxies must not be there."""

from __future__ import annotations

import pwd
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bbstage import identity
from bbstage.daemon import leftovers
from bbstage.identity import user_env
from bbstage.transfer import TransferSpec, walkproc
from tests.helpers import run_worker, tree_digests
from tests.unit.test_leftovers import NOBODY, owned_dir, temp

ROOTS = {"AWS_SECRET_ACCESS_KEY": "root-secret", "https_proxy": "http://root:pw@proxy:3128",
         "BBSTAGE_TOKEN": "root-token"}  # fmt: skip


@pytest.fixture
def roots_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ROOTS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_TIME", "C.UTF-8")


def spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[dict[str, str] | None]:
    """Record the ``env`` given to ``module.subprocess.<name>`` (the call still runs)."""
    seen: list[dict[str, str] | None] = []
    real = getattr(subprocess, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("env"))
        return real(*args, **kwargs)

    monkeypatch.setattr(module.subprocess, name, call)
    return seen


def leaks(env: dict[str, str] | None) -> list[str]:
    if env is None:
        return ["the whole environment (env not given)"]
    return [k for k, v in env.items() if k in ROOTS or v in ROOTS.values()]


def test_the_leftovers_unlinker_gets_no_root_environment(
    area: Path, roots_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = spy(monkeypatch, identity, "run")  # identity.unlink_as: every caller's
    theirs = owned_dir(area / "theirs", NOBODY)
    gone = temp(theirs, "a", owner=NOBODY)
    found = leftovers.find([(str(theirs), False)], "7")
    assert leftovers.remove(found, "7") == 1 and not gone.exists()
    assert len(seen) == 1 and leaks(seen[0]) == []
    assert seen[0] == user_env(NOBODY) and seen[0]["HOME"] == pwd.getpwuid(NOBODY).pw_dir
    assert seen[0]["LC_TIME"] == "C.UTF-8" and seen[0]["PATH"] == "/usr/bin:/bin"


def test_the_walk_process_gets_no_root_environment(
    tmp_path: Path, roots_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(walkproc, "MANY", 2)
    seen = spy(monkeypatch, walkproc, "Popen")
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}").write_bytes(bytes([i]) * 1000)
    run_worker(TransferSpec.between(f"{src}/", f"{tmp_path}/dst/", job_id="7"))
    assert tree_digests(tmp_path / "dst") == tree_digests(src)
    assert len(seen) == 1 and leaks(seen[0]) == []
    assert seen[0] is not None and set(seen[0]) <= {"PATH", "HOME", "LANG", "LC_TIME",
                                                     "TZ", "PYTHONPATH"}  # fmt: skip
