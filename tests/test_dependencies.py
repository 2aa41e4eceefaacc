"""Every imported package is declared where its importer is installed from, and the lock
files pin exactly what pyproject.toml declares.

The runtime (portal/, app.py, gunicorn.conf.py, migrations/) may import only
[project.dependencies]; the tests those plus the ``test`` group, the browser tests also
the ``browser`` group, bench/ the runtime and the ``bench`` group. A module is matched to
the distribution that installs it through the installed packages' metadata.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCAL = {"portal", "tests", "bench", "app", "migrations"}
# Declared for the runtime without an import of their own, each for a reason.
NOT_IMPORTED = {
    "tzdata": "the IANA zone files zoneinfo reads where the host has none",
    "jinja2": "the templates' language: templates/ are written against Jinja itself",
}


def _requirements(entries: Iterable[object]) -> list[Requirement]:
    found = []
    for entry in entries:
        if isinstance(entry, str):
            found.append(Requirement(entry))
        else:  # {include-group = "name"}
            assert isinstance(entry, dict), entry
            found.extend(group(entry["include-group"]))
    return found


def group(name: str) -> list[Requirement]:
    return _requirements(PYPROJECT["dependency-groups"][name])


def runtime() -> list[Requirement]:
    return _requirements(PYPROJECT["project"]["dependencies"])


def names(requirements: Iterable[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in requirements}


def _python_files(*paths: str, exclude: str | None = None) -> list[Path]:
    files: list[Path] = []
    for relative in paths:
        path = ROOT / relative
        found = [path] if path.is_file() else sorted(path.rglob("*.py"))
        files += [f for f in found if not (exclude and exclude in f.relative_to(ROOT).parts)]
    assert files, paths
    return files


def imported_modules(files: Iterable[Path]) -> dict[str, set[str]]:
    """Third-party top-level modules imported anywhere in ``files`` (in functions and
    ``try`` blocks too), each with the files importing it."""
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.partition(".")[0]
                if top in sys.stdlib_module_names or top in LOCAL or top == "__future__":
                    continue
                found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


_DISTRIBUTIONS = importlib.metadata.packages_distributions()


def distributions_of(module: str) -> set[str]:
    """The distributions that install ``module``; a module not installed here is taken to
    come from the distribution of its own name."""
    return {canonicalize_name(d) for d in _DISTRIBUTIONS.get(module, [module])}


AREAS = {
    "runtime": (
        _python_files("portal", "app.py", "gunicorn.conf.py", "migrations"),
        names(runtime()),
    ),
    "tests": (
        _python_files("tests", exclude="browser"),
        names(runtime()) | names(group("test")),
    ),
    "browser tests": (
        _python_files("tests/browser"),
        names(runtime()) | names(group("test")) | names(group("browser")),
    ),
    "bench": (_python_files("bench"), names(runtime()) | names(group("bench"))),
}


@pytest.mark.parametrize("area", AREAS)
def test_every_imported_package_is_declared_where_its_importer_installs_from(area):
    files, declared = AREAS[area]
    missing = {
        module: sorted(importers)
        for module, importers in imported_modules(files).items()
        if not distributions_of(module) & declared
    }
    assert missing == {}, f"imported by {area} but not declared for it: {missing}"


def test_the_runtime_declares_only_what_it_imports():
    """pywebpush and http-ece, the references the engine is measured and checked
    against, belong to the groups that use them, not to the portal's installs."""
    files, declared = AREAS["runtime"]
    imported = set().union(*(distributions_of(m) for m in imported_modules(files)))
    unused = declared - imported - set(NOT_IMPORTED)
    assert unused == set(), f"declared for the runtime, imported by none of it: {unused}"
    assert "pywebpush" in names(group("bench"))
    assert "http-ece" in names(group("test"))


def test_the_test_extra_mirrors_the_groups_the_readme_command_needs():
    """pip before 25.1 cannot install a dependency group; the README's test command
    installs the ``test`` extra, which must hold the test, browser and lint groups."""
    extra = {str(r) for r in _requirements(PYPROJECT["project"]["optional-dependencies"]["test"])}
    groups = {str(r) for name in ("test", "browser", "lint") for r in group(name)}
    assert extra == groups


def test_licence_metadata_is_an_spdx_expression_with_its_file():
    project = PYPROJECT["project"]
    assert project["license"] == "MIT"
    for pattern in project["license-files"]:
        assert list(ROOT.glob(pattern)), pattern
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def pins(lock: str) -> dict[str, str]:
    """``name: version`` of every package ``requirements/<lock>`` pins, after checking
    that each pin carries at least one hash."""
    text = (ROOT / "requirements" / lock).read_text()
    found: dict[str, str] = {}
    for block in re.split(r"\n(?=\S)", text):
        match = _PIN.match(block)
        if not match:
            assert block.startswith("#") or not block.strip(), block
            continue
        assert "--hash=sha256:" in block, f"{match.group(1)} is locked without a hash"
        found[canonicalize_name(match.group(1))] = match.group(2)
    return found


@pytest.mark.parametrize(
    ("lock", "declared"),
    [
        (
            "ci.txt",
            [*runtime(), *(r for g in ("test", "browser", "lint", "bench") for r in group(g))],
        ),
        ("runtime.txt", runtime()),
    ],
)
def test_the_locks_pin_every_declared_package_within_its_range(lock, declared):
    locked = pins(lock)
    outside = {
        str(r): locked.get(canonicalize_name(r.name))
        for r in declared
        if canonicalize_name(r.name) not in locked
        or not r.specifier.contains(locked[canonicalize_name(r.name)], prereleases=True)
    }
    assert outside == {}, f"requirements/{lock} is stale: run .ci/lock"


def test_the_runtime_lock_names_the_ci_lock_s_releases_and_nothing_for_tests():
    ci, deployed = pins("ci.txt"), pins("runtime.txt")
    assert {name: ci[name] for name in deployed} == deployed
    for only_elsewhere in ("pytest", "pywebpush", "http-ece", "playwright", "ruff"):
        assert only_elsewhere not in deployed
