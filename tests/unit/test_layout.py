"""The package's shape: modules by concept, sides that respect the trust boundary, no
import circle.

A module holds one concept, whatever its length: docs/architecture.md's module map names it
and the side of the trust boundary it is loaded on (``user``, ``root``, ``cli``); a module
missing from the map, or a row naming none, fails here, as does an import against the
sides (a ``user`` module importing a ``root`` or ``cli`` one would pull daemon code into a
user's process). A circle hidden behind a function-level import works until someone moves
the import to the top, and then fails at import time far from the change; so imports inside
functions count here as much as those at the top of a module.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bbstage"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
SIDES = {"user": {"user"}, "root": {"root", "user"}, "cli": {"cli", "root", "user"}}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its ``__init__``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its body (top level, inside
    functions, under ``if``). Importing ``a.b.c`` runs ``a`` and ``a.b`` first, so they count
    too, except the importer's own parent packages (already running when it is imported)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importer's package
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets.add(module)
            # `from pkg import sub` imports the module pkg.sub when there is one
            targets.update(f"{module}.{alias.name}" for alias in node.names)
    found = set()
    for target in targets:
        for candidate in [*_ancestors(target), target]:
            if candidate in known and candidate != name and candidate not in _ancestors(name):
                found.add(candidate)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports (``[a, b, ..., a]``), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_finder_sees_a_circle_and_resolves_imports(tmp_path: Path) -> None:
    """The checker itself: a circle through a function-level, relative import is found."""
    pkg = tmp_path / "bbstage" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from bbstage.sub import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    known = {"bbstage.sub", "bbstage.sub.a", "bbstage.sub.b"}
    edges = {
        "bbstage.sub.a": imports("bbstage.sub.a", pkg / "a.py", known),
        "bbstage.sub.b": imports("bbstage.sub.b", pkg / "b.py", known),
    }
    assert edges == {"bbstage.sub.a": {"bbstage.sub.b"}, "bbstage.sub.b": {"bbstage.sub.a"}}
    assert find_cycle(edges) == ["bbstage.sub.a", "bbstage.sub.b", "bbstage.sub.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def test_the_package_imports_form_no_circle() -> None:
    edges = graph()
    assert "bbstage.config" in edges and "bbstage.kinds" in edges["bbstage.config"]
    cycle = find_cycle(edges)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def module_map() -> dict[str, tuple[str, str]]:
    """docs/architecture.md's module map: path (a file, or a package ending in ``/``) ->
    (side, concept)."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("## Module map") :]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`bbstage/"):
            path = cells[0].strip("`")
            assert path not in rows, f"{path} twice in the module map"
            rows[path] = (cells[1], cells[2])
    return rows


def sides() -> dict[str, str]:
    """Each module's side: that of its own row, or of the nearest package row above it.
    Fails for a module the map does not cover, a row that covers no module, a row with no
    concept or an unknown side."""
    rows = module_map()
    out, used = {}, set()
    for name, path in modules().items():
        rel = path.relative_to(PACKAGE.parent).as_posix()
        covering = [p for p in rows if p == rel or (p.endswith("/") and rel.startswith(p))]
        assert covering, f"{rel} is not in docs/architecture.md's module map: add its row"
        row = max(covering, key=len)
        used.add(row)
        out[name] = rows[row][0]
    for row, (side, concept) in rows.items():
        assert side in SIDES, f"module map: {row}: side {side!r} is not one of {sorted(SIDES)}"
        assert concept, f"module map: {row} names no concept"
    stale = set(rows) - used
    assert not stale, f"module map rows that name no module (moved or removed?): {stale}"
    return out


def test_every_module_is_in_the_map_with_one_concept() -> None:
    """Every module has a row (or its package has) and a docstring; no row is stale."""
    assert set(sides()) == set(modules())
    for name, path in modules().items():
        if path.stat().st_size:
            assert ast.get_docstring(ast.parse(path.read_bytes())), f"{name}: no docstring"


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's contracts (pyproject.toml) on the package in ``tree``."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache", "--config",
         str(tree / "pyproject.toml")],
        capture_output=True, text=True, timeout=300, cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )  # fmt: skip


def test_the_import_contracts_hold() -> None:
    """The layers and the trust boundary (the user side imports neither the root nor the
    client side; the root side not the client side), as pyproject.toml's contracts say."""
    out = lint_imports(PACKAGE.parent)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_contracts_see_a_user_module_importing_root(tmp_path: Path) -> None:
    """The checker itself: a worker (user side) importing the engine breaks a contract."""
    shutil.copytree(PACKAGE, tmp_path / "bbstage", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PACKAGE.parent / "pyproject.toml", tmp_path)
    worker = tmp_path / "bbstage" / "transfer" / "worker.py"
    worker.write_text(worker.read_text() + "\nfrom bbstage.daemon import engine  # noqa\n")
    out = lint_imports(tmp_path)
    assert out.returncode != 0
    assert "bbstage.transfer.worker -> bbstage.daemon.engine" in out.stdout


# Modules outside a backend that still name one, each with the reason. Shrink, do not grow.
NAMES_A_BACKEND = {
    "bbstage/bench/": "`bbstage bench`'s S3 run and its S3 peers (s5cmd, rclone): the S3"
    " backend's benchmark, not yet moved into bbstage/movers/implementations/s3/",
    "bbstage/cli/main.py": "the help text of `bbstage bench` (above)",
}


def test_no_module_outside_a_backend_names_a_scheme() -> None:
    """A backend is one unit: only bbstage/movers/implementations/ and the registry
    (bbstage/movers/__init__.py) name a URL scheme (as a string, "s3" or "gs://...") or a
    store's credential variables (AWS_*, GOOGLE_*, AZURE_*). Docstrings may speak of them."""
    import re

    from bbstage import movers

    schemes = sorted(set(movers.known_implementations) - {"posix"} | {"s3a", "gcs", "http"})
    names = re.compile(r"\b(" + "|".join(schemes) + r")://|\b(AWS|AZURE|GOOGLE)_[A-Z]")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel.startswith("bbstage/movers/implementations/") or rel == "bbstage/movers/__init__.py":
            continue
        if any(rel.startswith(prefix) for prefix in NAMES_A_BACKEND):
            continue
        tree = ast.parse(path.read_bytes(), str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in docstrings:
                    continue
                if node.value in schemes or names.search(node.value):
                    found.append(f"{rel}:{node.lineno}: {node.value[:60]!r}")
    assert not found, "name a backend outside it (ask the registry instead):\n" + "\n".join(found)


# The modules that may hold the engine's store: the engine, and the store itself.
HOLD_THE_STORE = {"bbstage.daemon.engine", "bbstage.daemon.state"}


def engine_store_uses(source: str) -> list[int]:
    """The lines of ``source`` that reach an engine's store: ``.store`` on anything named
    an engine (``engine.store``, ``self.engine.store``, ``self._engine.store``)."""
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr == "store"
        and "engine" in ast.unparse(node.value).lower()
    )


def test_only_the_engine_reaches_its_store() -> None:
    """The engine acts on the job records (its transitions, one writer); the reconciler and
    the servers read through it (``Engine.job``, ``Engine.jobs``, ...), never through
    ``engine.store``: a module holding the store could write a record behind its back."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for name, path in modules().items()
        if name not in HOLD_THE_STORE
        for line in engine_store_uses(path.read_text())
    ]
    assert not found, "read through the engine, not its store:\n" + "\n".join(found)


def test_the_store_checker_sees_the_engines_store() -> None:
    source = "a = engine.store.job(1)\nb = self.engine.store\nc = self.store\nd = store.jobs()\n"
    assert engine_store_uses(source) == [1, 2]
