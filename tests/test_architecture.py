"""The package's import graph has no cycles: not at module level, not inside functions,
not behind ``if TYPE_CHECKING:``. The walker is checked on a planted cycle so the check
cannot pass by finding nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import portal

PACKAGE_ROOT = Path(portal.__file__).resolve().parent


def module_names(root: Path) -> dict[str, Path]:
    """Every module under the package ``root`` by dotted name (packages by their own name)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute name a relative ``from`` import in ``importer`` refers to."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    # In a package's __init__, "." is the package itself; in a module, its parent.
    drop = level - 1 if is_package else level
    if drop:
        base = base[:-drop]
    return ".".join([*base, module] if module else base)


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports, wherever the import statement stands."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def known(target: str) -> str | None:
        # "import a.b.c" names a.b.c; keep the longest prefix that is one of ours.
        parts = target.split(".")
        while parts:
            candidate = ".".join(parts)
            if candidate in modules:
                return candidate
            parts.pop()
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (target := known(alias.name)) is not None:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, is_package, node.level, node.module)
            for alias in node.names:
                # "from portal.x import y": y is a module of ours or a name in portal.x.
                submodule = f"{base}.{alias.name}" if base else alias.name
                target = submodule if submodule in modules else known(base)
                if target is not None:
                    found.add(target)
    found.discard(name)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module, as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(graph, set(group)) for group in groups]


def _cycle_through(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """One concrete cycle inside a strongly connected ``group``, starting at its first
    member: a breadth-first search back to it."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for other in sorted(graph[node] & group):
            if other == start:
                return [*paths[node], start]
            if other not in paths:
                paths[other] = [*paths[node], other]
                queue.append(other)
    raise AssertionError(f"{sorted(group)} is not strongly connected")


def test_the_portal_package_has_no_import_cycles() -> None:
    graph = import_graph(PACKAGE_ROOT)
    assert "portal.seams" in graph and len(graph) > 50  # the walk saw the package
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _package(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "planted"


def test_the_walker_finds_a_planted_cycle_in_every_kind_of_import(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "planted/__init__.py": "",
            "planted/a.py": "from planted.b import thing\n",
            "planted/b.py": "def f():\n    from . import c\n",
            "planted/c.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.d import D\n"
            ),
            "planted/sub/__init__.py": "",
            "planted/sub/d.py": "import planted.a\n",
            "planted/free.py": "from planted import a\n",
        },
    )
    graph = import_graph(root)
    assert graph["planted.a"] == {"planted.b"}
    assert graph["planted.b"] == {"planted.c"}
    assert graph["planted.c"] == {"planted.sub.d"}
    assert graph["planted.sub.d"] == {"planted.a"}
    assert find_cycles(graph) == [
        ["planted.a", "planted.b", "planted.c", "planted.sub.d", "planted.a"]
    ]


def test_relative_imports_resolve_from_a_package_and_from_a_module(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "planted/__init__.py": "from .x import y\n",
            "planted/x.py": "from . import sub\nfrom .sub import z\n",
            "planted/sub/__init__.py": "from ..x import y\nfrom . import z\n",
            "planted/sub/z.py": "",
        },
    )
    graph = import_graph(root)
    assert graph["planted"] == {"planted.x"}
    assert graph["planted.sub"] == {"planted.x", "planted.sub.z"}
    assert graph["planted.x"] == {"planted.sub", "planted.sub.z"}
    assert find_cycles(graph) == [["planted.sub", "planted.x", "planted.sub"]]


def test_a_tree_without_cycles_passes(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "planted/__init__.py": "",
            "planted/a.py": "from planted import b\n",
            "planted/b.py": "import planted.c\n",
            "planted/c.py": "",
        },
    )
    assert find_cycles(import_graph(root)) == []
