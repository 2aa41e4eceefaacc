"""The README and docs/ say only what the code does: the package map matches the tree, every
dotted name imports, every command and route exists, every environment variable is both
read and documented, and every relative link lands on a file (and heading)."""

from __future__ import annotations

import ast
import base64
import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from flask import Flask
from flask.cli import ScriptInfo
from flask.cli import cli as flask_cli

import portal.config
from portal import create_app
from portal.compliance.signing import SigningKey
from portal.jobs import job_names
from portal.seams import current_portal
from tests.conftest import make_settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
TEXTS = [README, *DOCS]

# The layout the docs are written for (issue #14) and where the code is until it lands.
# Each entry must still be pending: once the new name exists, the entry is stale and
# test_planned_moves_are_still_pending says which one to delete.
PLANNED_NAMES: dict[str, str] = {}  # a documented name -> where it is until a move lands
PLANNED_PATHS: dict[str, str | None] = {}  # package map row -> its path now (None: new)
PLANNED_FILES: set[str] = set()  # files a branch under way will add


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- reading Markdown -----------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~)")


def split_fences(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, code-block lines): fenced blocks apart from the text around them."""
    prose: list[str] = []
    code: list[str] = []
    inside = False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
            prose.append("")
            continue
        (code if inside else prose).append(line)
        if inside:
            prose.append("")
    return prose, code


def code_spans(text: str) -> list[str]:
    """Every inline code span (single or double backticks, across line breaks), per
    paragraph so one stray backtick cannot shift the rest of the file."""
    prose, _ = split_fences(text)
    spans: list[str] = []
    for paragraph in re.split(r"\n\s*\n", "\n".join(prose)):
        for match in re.finditer(r"(`+)(.+?)\1", paragraph, re.S):
            spans.append(" ".join(match.group(2).split()))
    return spans


def code_lines(text: str) -> list[str]:
    """Code-block lines, with shell continuations (a trailing backslash) joined."""
    _, code = split_fences(text)
    lines: list[str] = []
    pending = ""
    for line in code:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_fences(path.read_text("utf-8"))
    seen: dict[str, int] = {}
    result: set[str] = set()
    for line in prose:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def test_markdown_readers():
    text = (
        "Run `flask --app app\nportal verify-log` now.\n\n"
        "```sh\nflask --app app portal export \\\n  --from 2026-01-01\n```\n\n"
        "## The `sw.js` page (v2)\n\n``a`b`` and `c`\n"
    )
    assert code_spans(text) == ["flask --app app portal verify-log", "sw.js", "a`b", "c"]
    assert code_lines(text) == ["flask --app app portal export    --from 2026-01-01"]
    assert slug("The `sw.js` page (v2)") == "the-swjs-page-v2"
    assert slug("Consent-history exports") == "consent-history-exports"


# --- the package map ------------------------------------------------------------------


def package_map_rows(readme: str) -> dict[str, str]:
    """The README's package map: each path in a row's first cell -> the row's entry points
    cell. Names after the first in a cell (`api.py`, `errors.py`) sit beside the first."""
    section = readme.split("## Package map", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`portal"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        base = names[0] if names[0].endswith("/") else names[0].rsplit("/", 1)[0] + "/"
        for index, name in enumerate(names):
            rows[name if index == 0 else base + name] = cells[2]
    return rows


def tree_entries(root: Path) -> set[str]:
    """What the map must cover: every folder under portal/ holding Python files (namespace
    packages included) and every top-level module."""
    base = root / "portal"
    entries = {"portal/"}
    for folder in base.rglob("*"):
        if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py")):
            entries.add(folder.relative_to(root).as_posix() + "/")
    for module in base.glob("*.py"):
        if module.name != "__init__.py":
            entries.add(module.relative_to(root).as_posix())
    return entries


def map_problems(
    rows: Iterable[str], root: Path, planned: dict[str, str | None] | None = None
) -> list[str]:
    planned = PLANNED_PATHS if planned is None else planned
    tree = tree_entries(root)
    listed = set()
    problems = []
    for row in rows:
        if (root / row).exists():
            listed.add(row)
        elif row in planned:
            now = planned[row]
            if now is not None:
                listed.add(now)
        else:
            problems.append(f"{row} is in the package map but not in the tree")
    problems += [f"{entry} is missing from the package map" for entry in sorted(tree - listed)]
    return problems


def test_the_package_map_matches_the_tree():
    rows = package_map_rows(README.read_text("utf-8"))
    assert "portal/subscriptions/" in rows  # a namespace package (no __init__.py)
    assert map_problems(rows, ROOT) == []


def _tree(root: Path, files: Iterable[str]) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (["portal/", "portal/a/", "portal/b/", "portal/m.py"], []),
        (
            ["portal/", "portal/a/", "portal/m.py"],
            ["portal/b/ is missing from the package map"],
        ),
        (
            ["portal/", "portal/a/", "portal/b/"],
            ["portal/m.py is missing from the package map"],
        ),
        (
            ["portal/", "portal/a/", "portal/b/", "portal/m.py", "portal/gone/"],
            ["portal/gone/ is in the package map but not in the tree"],
        ),
        (
            ["portal/", "portal/a/", "portal/renamed/", "portal/m.py", "portal/new.py"],
            [],
        ),
    ],
    ids=["complete", "namespace-package-missing", "module-missing", "stale-row", "planned"],
)
def test_map_problems_name_what_is_missing_or_stale(tmp_path, rows, expected):
    # b is a namespace package: Python files, no __init__.py.
    root = _tree(
        tmp_path,
        [
            "portal/__init__.py",
            "portal/a/__init__.py",
            "portal/a/x.py",
            "portal/b/y.py",
            "portal/m.py",
            "portal/__pycache__/m.pyc",
        ],
    )
    planned = {"portal/renamed/": "portal/b/", "portal/new.py": None}
    assert map_problems(rows, root, planned) == expected


# --- dotted names ---------------------------------------------------------------------

DOTTED = re.compile(r"(?<![\w/.@-])portal(?:\.[A-Za-z_]\w*)+")


def _import_and_get(name: str) -> Any:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            target: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is not None and module_name.startswith(error.name):
                continue
            raise
        for attribute in parts[cut:]:
            target = getattr(target, attribute)  # AttributeError: a stale name
        return target
    raise ModuleNotFoundError(name)


def _planned_alias(name: str) -> str | None:
    for new, now in PLANNED_NAMES.items():
        if name == new or name.startswith(new + "."):
            return now + name[len(new) :]
    return None


def resolve(name: str) -> Any:
    """The object a dotted name in the docs names, now or (planned) once moved."""
    try:
        return _import_and_get(name)
    except (ImportError, AttributeError):
        alias = _planned_alias(name)
        if alias is None:
            raise
        return _import_and_get(alias)


def dotted_names(text: str) -> set[str]:
    return set(DOTTED.findall(text))


def _documented_names() -> list[tuple[str, str]]:
    return sorted({(_rel(path), name) for path in TEXTS for name in dotted_names(path.read_text())})


def test_the_architecture_and_the_map_name_things_by_importable_paths():
    architecture = dotted_names((ROOT / "docs" / "architecture.md").read_text())
    entry_points = set().union(*map(dotted_names, package_map_rows(README.read_text()).values()))
    assert len(architecture) > 80 and len(entry_points) > 30
    assert "portal.subscriptions.services.upsert_subscription" in architecture
    assert "portal.delivery.engine.Dispatcher.claim" in architecture


# Logger names the docs quote in example log lines: not import paths, but each must be a
# logger the code really writes to.
LOGGER_NAMES = {"portal.audit", "portal.dispatch"}


@pytest.mark.parametrize(("doc", "name"), _documented_names())
def test_every_dotted_name_resolves(doc, name):
    if name in LOGGER_NAMES:
        source = "\n".join(p.read_text() for p in (ROOT / "portal").rglob("*.py"))
        assert f'getLogger("{name}")' in source, f"no code logs to {name}"
        return
    resolve(name)


def test_a_stale_name_does_not_resolve():
    assert callable(resolve("portal.subscriptions.services.upsert_subscription"))
    with pytest.raises(AttributeError):
        resolve("portal.subscriptions.services.no_such_function")
    with pytest.raises((ImportError, AttributeError)):
        resolve("portal.no_such_package.thing")
    assert dotted_names("see https://portal.example.com and `portal.config.Settings`.") == {
        "portal.config.Settings"
    }


def test_planned_moves_are_still_pending():
    """Once the restructure lands, each alias here must go: the docs' names then resolve
    on their own."""
    for new in PLANNED_NAMES:
        try:
            _import_and_get(new)
        except (ImportError, AttributeError):
            continue
        pytest.fail(f"{new} exists now: remove it from PLANNED_NAMES")
    for row in PLANNED_PATHS:
        assert not (ROOT / row).exists(), f"{row} exists now: remove it from PLANNED_PATHS"
    for name in PLANNED_FILES:
        assert not (ROOT / name).exists(), f"{name} exists now: remove it from PLANNED_FILES"


# --- commands -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs_app(tmp_path_factory) -> Iterator[Flask]:
    folder = tmp_path_factory.mktemp("docs-app")
    app = create_app(make_settings(f"sqlite:///{folder / 'portal.sqlite3'}", str(folder)))
    yield app
    app.extensions["portal.db"].engine.dispose()


COMMAND_NAME = re.compile(r"[a-z][a-z0-9-]*")
STOP = {"|", "||", "&&", ";", "#", ">", "<", "2>"}


def command_mentions(text: str) -> list[list[str]]:
    """Each `flask --app app …` and `portal …` the text mentions, as the words after
    `flask --app app` (a bare `portal …` span is given `portal` as its first word)."""
    mentions = []
    for chunk in code_spans(text) + code_lines(text):
        words = chunk.split()
        for index, word in enumerate(words):
            if word.endswith("flask") and words[index + 1 : index + 3] == ["--app", "app"]:
                mentions.append(_until_stop(words[index + 3 :]))
        if words and words[0] == "portal" and len(words) > 1:
            mentions.append(_until_stop(words))
    return [mention for mention in mentions if mention]


def _until_stop(words: list[str]) -> list[str]:
    taken = []
    for word in words:
        if word in STOP or word.startswith("#"):
            break
        taken.append(word)
    return taken


def command_problems(app: Flask, words: list[str]) -> list[str]:
    """What is wrong with one mention: an unknown command or subcommand, an option the
    command does not take, a job `run-job` does not know."""
    # Flask's group pushes an application context while it looks commands up; closing
    # the click context pops it again.
    with click.Context(flask_cli, obj=ScriptInfo(create_app=lambda: app)) as ctx:
        return _command_problems(ctx, words)


def _command_problems(ctx: click.Context, words: list[str]) -> list[str]:
    info = ctx.obj
    command: click.Command = flask_cli
    path: list[str] = []
    problems = []
    rest = list(words)
    while rest and isinstance(command, click.Group):
        word = rest[0].strip("[]")
        if not COMMAND_NAME.fullmatch(word):
            break  # a placeholder (NAME, …) after a group
        found = command.get_command(ctx, word)
        if found is None:
            return [f"flask --app app {' '.join([*path, word])}: no such command"]
        command, path, rest = found, [*path, word], rest[1:]
        ctx = click.Context(command, parent=ctx, info_name=word, obj=info)
    options = {"--help"}
    for param in command.params:
        options.update(opt for opt in [*param.opts, *param.secondary_opts] if opt.startswith("--"))
    arguments = []
    for written in rest:
        word = written.strip("[]")
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            if name not in options:
                problems.append(f"flask --app app {' '.join(path)}: no option {name}")
        elif not word.startswith("-"):
            arguments.append(word)
    job = arguments[0] if path[-1:] == ["run-job"] and arguments else None
    if job is not None and COMMAND_NAME.fullmatch(job) and job not in job_names():
        problems.append(f"run-job: no job {job!r}")
    return problems


def _mentions() -> list[tuple[str, str]]:
    return sorted(
        {
            (_rel(path), " ".join(words))
            for path in TEXTS
            for words in command_mentions(path.read_text())
        }
    )


def test_the_docs_mention_the_commands():
    mentioned = {words for _, words in _mentions()}
    assert "run" in mentioned and "db upgrade" in mentioned
    assert any(words.startswith("portal run-job canonicalise-endpoints") for words in mentioned)
    assert any(words.startswith("portal topic add SLUG") for words in mentioned)


@pytest.mark.parametrize(("doc", "mention"), _mentions())
def test_every_command_mentioned_exists(docs_app, doc, mention):
    assert command_problems(docs_app, mention.split()) == []


@pytest.mark.parametrize(
    ("mention", "problem"),
    [
        ("portal verify-log --anchor SEQ:HASH", None),
        ("portal campaign create --topic t --send-at X", None),
        ("portal nonsense", "no such command"),
        ("portal campaign launch", "no such command"),
        ("portal verify-log --anchors X", "no option --anchors"),
        ("portal run-job sweep", None),
        ("portal run-job sweeep", "no job 'sweeep'"),
        ("portal run-job NAME", None),
    ],
)
def test_command_problems_are_found(docs_app, mention, problem):
    found = command_problems(docs_app, mention.split())
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0]


def test_the_jobs_table_lists_every_job():
    section = (ROOT / "docs" / "operations.md").read_text().split("## Jobs and the scheduler")[1]
    table = set(re.findall(r"^\| `([a-z-]+)` \|", section, re.M))
    assert table == set(job_names())


# --- routes ---------------------------------------------------------------------------

ROUTE = re.compile(r"\b((?:(?:GET|POST|PUT|PATCH|DELETE) )+)(/[^\s`|,;)\]]*)")
PAGE = re.compile(r"/(?:api/|staff/|preferences\b|policy/)\S*")


def normalise(path: str) -> str:
    path = path.split("?", 1)[0].rstrip("…").rstrip(".")
    return re.sub(r"<[^>]*>|\{[^}]*\}", "<>", path)


def url_map(app: Flask) -> dict[str, set[str]]:
    routes: dict[str, set[str]] = {}
    for rule in app.url_map.iter_rules():
        routes.setdefault(normalise(rule.rule), set()).update(rule.methods or ())
    return routes


def route_mentions(text: str) -> set[tuple[str, str]]:
    """Each `METHOD /path` (or `GET POST /path`) the text names."""
    return {
        (method, normalise(path))
        for methods, path in ROUTE.findall(text)
        for method in methods.split()
    }


def page_mentions(text: str) -> set[str]:
    """Paths written alone in a code span (`/staff/admin/topics`)."""
    return {normalise(span) for span in code_spans(text) if PAGE.fullmatch(span)}


def _routes() -> list[tuple[str, str, str]]:
    return sorted(
        {
            (_rel(path), method, route)
            for path in TEXTS
            for method, route in route_mentions(path.read_text())
        }
    )


def test_the_docs_mention_the_routes():
    mentioned = {(method, route) for _, method, route in _routes()}
    assert ("POST", "/api/push/subscribe") in mentioned
    assert ("GET", "/staff/campaigns/<>/progress.json") in mentioned
    assert len(mentioned) > 12


@pytest.mark.parametrize(("doc", "method", "route"), _routes())
def test_every_route_mentioned_exists_with_its_method(docs_app, doc, method, route):
    methods = url_map(docs_app).get(route)
    assert methods is not None, f"{doc}: no route {route}"
    assert method in methods, f"{doc}: {route} does not answer {method}"


def test_the_api_table_lists_every_json_route(docs_app):
    documented = route_mentions((ROOT / "docs" / "api.md").read_text())
    served = {
        (method, route)
        for route, methods in url_map(docs_app).items()
        if route.startswith("/api/")
        for method in methods - {"HEAD", "OPTIONS"}
    }
    assert served - documented == set()


def staff_route_table(text: str) -> dict[tuple[str, str], str]:
    """docs/staff-console.md's table of every staff route: (method, path) -> roles."""
    section = text.split("## Every staff route", 1)[1]
    table = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([A-Z ]+) (/\S+)`", cells[0]) if len(cells) == 3 else None
        if match:
            for method in match.group(1).split():
                table[(method, normalise(match.group(2)))] = cells[1]
    return table


def test_the_staff_route_table_matches_each_views_rule(docs_app):
    table = staff_route_table((ROOT / "docs" / "staff-console.md").read_text())
    served = {}
    for rule in docs_app.url_map.iter_rules():
        if not rule.rule.startswith("/staff"):
            continue
        roles = getattr(docs_app.view_functions[rule.endpoint], "staff_roles", None)
        written = "none" if roles is None else ", ".join(sorted(r.value for r in roles)) or "any"
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}:
            served[(method, normalise(rule.rule))] = written
    assert table == served


def test_every_route_is_documented_with_each_method(docs_app):
    documented = set().union(*(route_mentions(path.read_text()) for path in TEXTS))
    served = {
        (method, route)
        for route, methods in url_map(docs_app).items()
        if not route.startswith("/static/")
        for method in methods - {"HEAD", "OPTIONS"}
    }
    assert sorted(served - documented) == []


def test_every_page_mentioned_exists(docs_app):
    routes = url_map(docs_app)
    problems = []
    for path in TEXTS:
        for page in page_mentions(path.read_text()):
            known = page in routes or (
                page.endswith("/") and any(route.startswith(page) for route in routes)
            )
            if not known:
                problems.append(f"{_rel(path)}: {page}")
    assert problems == []


def test_route_mentions_are_normalised(docs_app):
    assert route_mentions(
        "`GET /staff/campaigns/{id}/progress.json`, POST /x?y=1, GET POST /z"
    ) == {
        ("GET", "/staff/campaigns/<>/progress.json"),
        ("POST", "/x"),
        ("GET", "/z"),
        ("POST", "/z"),
    }
    assert page_mentions("open `/preferences?token=…` or `/staff/compliance/subscribers/<id>`") == {
        "/preferences",
        "/staff/compliance/subscribers/<>",
    }
    assert "/api/push/nothing" not in url_map(docs_app)


# --- environment variables ------------------------------------------------------------

ENV_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
FAMILY = re.compile(r"([A-Z][A-Z0-9_]*?)(?:\(\\d\+\)|<n>|\*)")


def configuration_variables(text: str) -> set[str]:
    """The names in the first column of docs/configuration.md's tables."""
    names = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            first = line.strip("|").split("|", 1)[0]
            names.update(n for n in re.findall(r"`([^`]+)`", first) if ENV_NAME.fullmatch(n))
    return names


def _config_scan(source: str) -> tuple[set[str], set[str]]:
    """(names, name families such as SUBSCRIPTION_AUTH_KEY_V<n>) in portal/config.py's
    string constants."""
    names, families = set(), set()
    tree = ast.parse(source)
    # The pieces of an f-string ("SUBSCRIPTION_AUTH_KEY_V" in f"…_V{n}") are no names.
    pieces = {
        id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in pieces
        ):
            if ENV_NAME.fullmatch(node.value):
                names.add(node.value)
            elif match := FAMILY.fullmatch(node.value):
                families.add(match.group(1))
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            text = head.value if isinstance(head, ast.Constant) else None
            if isinstance(text, str) and re.fullmatch(r"[A-Z][A-Z0-9_]*_V", text):
                families.add(text)
    return names, families


def read_by_config() -> tuple[set[str], set[str]]:
    """What the application reads: portal.config.environment_variables() when it exists,
    else a scan of portal/config.py."""
    listing = getattr(portal.config, "environment_variables", None)
    if listing is None:
        return _config_scan((ROOT / "portal" / "config.py").read_text())
    names, families = set(), set()
    for name in listing():
        if ENV_NAME.fullmatch(name):
            names.add(name)
        elif match := FAMILY.fullmatch(name):
            families.add(match.group(1))
        else:
            names.add(name)
    return names, families


def read_elsewhere() -> set[str]:
    """Variables read outside portal/config.py: os.environ in portal/, app.py and
    gunicorn.conf.py."""
    files = [*sorted((ROOT / "portal").rglob("*.py")), ROOT / "app.py", ROOT / "gunicorn.conf.py"]
    pattern = re.compile(r"(?:environ\.(?:get|setdefault)\(|environ\[|getenv\()\s*\"([A-Z0-9_]+)\"")
    return {name for path in files for name in pattern.findall(path.read_text())}


def test_config_scan_finds_names_and_families():
    names, families = _config_scan(
        'x = environ.get("PUBLIC_URL")\n'
        'y = _int(environ, "RETRY_MAX_ATTEMPTS", 5)\n'
        r'm = re.fullmatch(r"SUBSCRIPTION_AUTH_KEY_V(\d+)", name)'
        "\n"
        'e = "production"\n'
        'f = f"SUBSCRIPTION_AUTH_KEY_V{version}"\n'
    )
    assert names == {"PUBLIC_URL", "RETRY_MAX_ATTEMPTS"}
    assert families == {"SUBSCRIPTION_AUTH_KEY_V"}


def test_every_variable_read_is_documented_and_every_documented_one_is_read():
    documented = configuration_variables((ROOT / "docs" / "configuration.md").read_text())
    names, families = read_by_config()
    elsewhere = read_elsewhere()
    assert {"DATABASE_URL", "SECRET_KEY", "STAFF_SESSION_MAX_HOURS"} <= names
    undocumented = sorted((names | elsewhere) - documented)
    assert undocumented == [], "read by the code, missing from docs/configuration.md"
    for family in families:
        assert any(name.startswith(family) for name in documented), family
    unread = sorted(
        name
        for name in documented - names - elsewhere
        if not any(name.startswith(family) for family in families)
    )
    assert unread == [], "in docs/configuration.md, read by nothing"


# --- links ----------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def link_problems(path: Path) -> list[str]:
    prose, _ = split_fences(path.read_text("utf-8"))
    problems = []
    for target in LINK.findall("\n".join(prose)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        name = linked.relative_to(ROOT).as_posix() if linked.is_relative_to(ROOT) else str(linked)
        if not linked.exists():
            if name not in PLANNED_FILES:
                problems.append(f"{_rel(path)}: {target} (no such file)")
            continue
        if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{_rel(path)}: {target} (no such heading)")
    return problems


@pytest.mark.parametrize("path", TEXTS, ids=_rel)
def test_every_relative_link_lands(path):
    assert link_problems(path) == []


def test_the_readme_links_every_doc():
    linked = {target.partition("#")[0] for target in LINK.findall(README.read_text())}
    docs = {_rel(path) for path in DOCS} | PLANNED_FILES
    assert sorted(docs - linked) == []


def test_link_problems_are_found(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# A page\n\n## Some part\n\n```\n# not a heading\n```\n"
    )
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#some-part) [ok](#top) [web](https://example.com)\n"
        "[bad](docs/b.md) [bad](docs/a.md#not-a-heading)\n\n# Top\n"
    )
    assert link_problems(page) == [
        "README.md: docs/b.md (no such file)",
        "README.md: docs/a.md#not-a-heading (no such heading)",
    ]


REPO_PATH = re.compile(r"(?:\.ci|bench|migrations|portal|static|templates|tests)(?:/[\w.-]*)*")


def path_problems(text: str, root: Path) -> list[str]:
    """Repository paths written in code spans that are not there (a placeholder such as
    NAME in `bench/results/NAME.json` is no path)."""
    problems = []
    for span in code_spans(text):
        if not REPO_PATH.fullmatch(span) or re.search(r"\b[A-Z]{2,}\b", span):
            continue
        if not (root / span).exists() and span not in PLANNED_PATHS:
            problems.append(span)
    return problems


@pytest.mark.parametrize("path", TEXTS, ids=_rel)
def test_every_repository_path_written_exists(path):
    assert path_problems(path.read_text(), ROOT) == []


def test_path_problems_are_found():
    text = "`portal/api.py`, `portal/gone.py`, `bench/results/NAME.json`, `tests/` and `portal.api`"
    assert path_problems(text, ROOT) == ["portal/gone.py"]


# --- recipes --------------------------------------------------------------------------


def code_block(path: Path, containing: str, language: str = "sh") -> str:
    """The fenced block of ``language`` in ``path`` that contains ``containing``."""
    blocks = re.findall(rf"^```{language}\n(.*?)^```", path.read_text("utf-8"), re.S | re.M)
    found = [block for block in blocks if containing in block]
    assert len(found) == 1, f"{_rel(path)}: {len(found)} {language} blocks hold {containing!r}"
    return found[0]


@pytest.fixture
def live_app(database_url, tmp_path) -> Iterator[Flask]:
    """The portal on the real clock: a signature's timestamp is checked against it."""
    app = create_app(make_settings(database_url, str(tmp_path / "live")))
    app.config["TESTING"] = True
    yield app
    app.extensions["portal.db"].engine.dispose()


FEEDBACK_SECRET = "feedback-secret-one"  # the test settings' first FEEDBACK_SECRETS entry


def test_the_feedback_signing_recipe_is_accepted(live_app):
    recipe = code_block(ROOT / "docs" / "operations.md", "openssl dgst")
    # curl stands aside: it prints what it would send, one argument a line.
    script = "curl() { printf '%s\\n' \"$@\"; }\n" + recipe
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "FEEDBACK_SECRET": FEEDBACK_SECRET},
        check=True,
    )
    arguments = done.stdout.splitlines()
    assert "http://127.0.0.1:5000/api/push/feedback" in arguments
    headers = dict(arguments[i + 1].split(": ", 1) for i, a in enumerate(arguments) if a == "-H")
    body = arguments[arguments.index("--data-binary") + 1]
    response = live_app.test_client().post(
        "/api/push/feedback", data=body.encode(), headers=headers
    )
    assert response.status_code == 200, response.json
    assert response.json["organization"] == "acme"


def test_the_feedback_signing_snippet_is_accepted(live_app):
    snippet = code_block(ROOT / "docs" / "operations.md", "hmac.new", "python")
    body = b'{"organization":"acme","events":[],"truncated":false,"eventsOmitted":0}'
    names: dict[str, Any] = {"secret": FEEDBACK_SECRET, "body": body}
    exec(snippet, names)  # the documented snippet, as written
    response = live_app.test_client().post(
        "/api/push/feedback", data=body, headers=names["headers"]
    )
    assert response.status_code == 200, response.json


def test_the_plain_tools_recipe_checks_an_export(
    app, clock, subscriptions, catalogue_ready, tmp_path
):
    for _ in range(3):  # a few people, so the chain has links to check
        response = app.test_client().post(
            "/api/push/subscribe",
            json={
                "subscription": subscriptions().to_json(),
                "topics": ["weekly-digest"],
                "policyVersion": "v1",
            },
        )
        assert response.status_code == 201, response.json
    day = clock.now().date().isoformat()
    bundle = tmp_path / "bundle"
    exported = app.test_cli_runner().invoke(
        args=[
            "portal",
            "export",
            "--from",
            day,
            "--to",
            day,
            "--format",
            "ndjson",
            "--out",
            str(bundle),
        ]
    )
    assert exported.exit_code == 0, exported.output
    key = SigningKey.from_setting(current_portal(app).settings.export_signing_key)
    recipe = code_block(ROOT / "docs" / "compliance.md", "sha256sum -c")
    # The recipe as written, with the console's key filled in and its scratch files in
    # this test's folder.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    script = recipe.replace("<public key hex from the console>", key.public.hex).replace(
        "/tmp/", f"{scratch}/"
    )

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=bundle,
            capture_output=True,
            text=True,
            check=False,
        )

    good = run()
    assert good.returncode == 0, good.stderr
    assert "consent-events.ndjson: OK" in good.stdout
    assert "Signature Verified Successfully" in good.stdout
    assert good.stdout.rstrip().endswith("[]")  # every consecutive pair chains

    data = bundle / "consent-events.ndjson"
    data.write_bytes(data.read_bytes().replace(b'"leaf_hash":"', b'"leaf_hash":"0', 1))
    tampered = run()
    assert tampered.returncode != 0
    assert "consent-events.ndjson: FAILED" in tampered.stdout


def test_the_key_one_liners_make_keys_the_portal_takes():
    text = (ROOT / "docs" / "configuration.md").read_text()
    one_liners = re.findall(r"python3 -c '([^']+)'", text)
    made = {
        code: subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout.strip()
        for code in one_liners
    }
    signing = [out for code, out in made.items() if "generate_signing_key" in code]
    data_keys = [out for code, out in made.items() if "urandom(32)" in code]
    assert len(signing) == 1 and len(data_keys) == 1
    SigningKey.from_setting(signing[0])  # a malformed key raises
    assert len(base64.b64decode(data_keys[0], validate=True)) == 32
