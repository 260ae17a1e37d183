"""The Lua interpreters the hooks must run under: every one a Slurm may link.

Slurm builds against the system's Lua: Debian and Ubuntu 5.1, EL8 5.3, EL9 5.4. The Lua suites
take ``lua`` (one of these) as a fixture; a missing interpreter fails the test
(``scripts/local-cluster up``, run by ``scripts/test``, installs all four).
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest

LUAS = ("lua5.1", "lua5.2", "lua5.3", "lua5.4")
# The oldest and the newest, for the slow suites: what differs between Lua versions
# (unpack, integer and float numbers, bytecode) differs already between these two.
ENDS = ("lua5.1", "lua5.4")


def interpreter(name: str) -> str:
    """The path of ``name`` (e.g. "lua5.4"); fails the test when it is not installed."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not installed: scripts/local-cluster up (scripts/test) installs it")
    return path


def version(name: str) -> str:
    """ "lua5.4" -> "5.4" (what `bbstage install-lua --lua` takes)."""
    return name.removeprefix("lua")


def lua_fixture(names: tuple[str, ...] = LUAS, scope: str = "function") -> Any:
    """A fixture ``lua`` (the interpreter's name) over ``names``: test ids end in [lua5.N]."""

    @pytest.fixture(scope=scope, params=names)  # type: ignore[call-overload]
    def lua(request: pytest.FixtureRequest) -> str:
        interpreter(request.param)
        return str(request.param)

    return lua
