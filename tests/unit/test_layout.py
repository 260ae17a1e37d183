"""The package's shape (issue [O]): its imports form no circle, and its modules stay small.

A circle hidden behind a function-level import works until someone moves the import to the
top, and then fails at import time far from the change; so imports inside functions count
here as much as those at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bbstage"
MAX_LINES = 450
# Modules allowed over MAX_LINES, each with the reason. Shrink this list, do not grow it.
LONG_MODULES = {
    "bbstage.directives": "the grammar, check for check in step with lua/bbstage/directives.lua",
    "bbstage.engine": "the per-job state machine, one method per hook, read as one",
    "bbstage.state": "the durable store (SQLite schema, its writes and its reads), read as one",
    "bbstage.dask_executor": "one attempt's life on Dask (submit, events, settle), read as one;"
    " its fair-share gate is the policy of bbstage/fairshare.py applied before submit",
}


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
    assert "bbstage.config" in edges and "bbstage.units" in edges["bbstage.config"]
    cycle = find_cycle(edges)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_module_is_over_the_size_guide() -> None:
    sizes = {name: len(path.read_bytes().splitlines()) for name, path in modules().items()}
    long = {name: n for name, n in sizes.items() if n > MAX_LINES and name not in LONG_MODULES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"
    stale = {name for name in LONG_MODULES if sizes.get(name, 0) <= MAX_LINES}
    assert not stale, f"no longer over {MAX_LINES} lines: drop from LONG_MODULES: {stale}"


# Modules outside a backend that still name one, each with the reason. Shrink, do not grow.
NAMES_A_BACKEND = {
    "bbstage/bench/": "`bbstage bench`'s S3 run and its S3 peers (s5cmd, rclone): the S3"
    " backend's benchmark, not yet moved into bbstage/movers/implementations/s3/",
    "bbstage/cli.py": "the help text of `bbstage bench` (above)",
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
