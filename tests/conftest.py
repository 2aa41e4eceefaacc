"""Test fixtures: a migrated database per run (SQLite or PostgreSQL), an app per test.

``PORTAL_TEST_DATABASE`` chooses the backend. Unset: SQLite, a migrated template file
copied for every test. A PostgreSQL URL: a fresh database created on that server for
the run, migrated, emptied after every test and dropped at the end.

Under pytest-xdist (``-n auto``) every worker is a run of its own: its own template
file in its own temporary folder on SQLite, its own databases on PostgreSQL, named
``portal_test_<run>_<worker>_<random>``. The controller drops whatever databases of its
run are left when the run ends (a worker that crashed cannot drop its own), and passing
runs leave no temporary folder (``tmp_path_retention_policy = "failed"``).
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import settings as hypothesis_settings

from portal import create_app
from portal.clock import FrozenClock
from portal.config import (
    DEFAULT_PUSH_HOSTS,
    RateLimitSettings,
    Settings,
    generate_signing_key,
    generate_vapid_keys,
    normalise_database_url,
)
from portal.consent import catalogue
from portal.db import create_engine, db
from portal.migrate import upgrade
from tests.factories import SubscriptionFactory

TEST_DATABASE = os.environ.get("PORTAL_TEST_DATABASE", "").strip()
BACKEND = "postgresql" if TEST_DATABASE.startswith(("postgres://", "postgresql")) else "sqlite"
KEY_V1 = base64.b64encode(b"\x01" * 32).decode()
KEY_V2 = base64.b64encode(b"\x02" * 32).decode()
VAPID_PRIVATE, VAPID_PUBLIC = generate_vapid_keys()
EXPORT_SIGNING_KEY = generate_signing_key()
CONSENT_LOG_SIGNING_KEY = generate_signing_key()
# The run's and this process's parts of every database name: a run with workers passes
# its id to each of them (pytest_configure_node).
RUN_ID_KEY = "portal_test_run"
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")

# Hypothesis's per-example deadline (200 ms) measures how busy the machine is, not the
# code: two workers on two shared CPUs miss it now and then. The property tests that
# need a deadline set their own.
hypothesis_settings.register_profile("portal", deadline=None)
hypothesis_settings.load_profile("portal")


# A test that fails only sometimes is a defect to find, never one to run again until it
# passes: the run refuses to start with a plugin that reruns or retries failed tests.
RERUN_PLUGIN = re.compile(r"rerun|retry|flaky", re.IGNORECASE)


def rerun_plugins(config: pytest.Config) -> list[str]:
    """The loaded pytest plugins that rerun or retry failed tests, as "module (-p no:name)"."""
    found = set()
    for name, plugin in config.pluginmanager.list_name_plugin():
        module = getattr(plugin, "__name__", None) or type(plugin).__module__
        if RERUN_PLUGIN.search(module):
            found.add(f"{module} (-p no:{name})")
    return sorted(found)


def pytest_configure(config: pytest.Config) -> None:
    if found := rerun_plugins(config):
        raise pytest.UsageError(
            f"a plugin that reruns failed tests is loaded: {', '.join(found)}; a flaky test "
            "must fail the run: uninstall the plugin or disable it"
        )
    workerinput = getattr(config, "workerinput", None)
    config.stash[_RUN_ID] = workerinput[RUN_ID_KEY] if workerinput else uuid.uuid4().hex[:8]


_RUN_ID = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, in the controller: each worker learns the run's id."""
    node.workerinput[RUN_ID_KEY] = node.config.stash[_RUN_ID]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the controller (or a run without workers): drop every database of this run
    still on the server, whichever worker made it."""
    if BACKEND != "postgresql" or hasattr(session.config, "workerinput"):
        return
    PostgresServer(TEST_DATABASE).drop_run(session.config.stash[_RUN_ID])


def database_prefix(config: pytest.Config) -> str:
    return f"portal_test_{config.stash[_RUN_ID]}_{WORKER}"


# The fixtures through which a test reaches the database PORTAL_TEST_DATABASE chooses.
DATABASE_FIXTURES = frozenset(
    {"backend", "pg_server", "fresh_database", "_migrated_template", "database_url"}
)


def opens_no_test_database(item: pytest.Item) -> bool:
    """A test that reaches no database fixture and is not PostgreSQL-only behaves the same
    whichever backend the run chose: it gets the ``no_database`` marker, which CI's
    PostgreSQL pass leaves out (the SQLite pass has run it)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    return not fixtures & DATABASE_FIXTURES and "postgres_only" not in item.keywords


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="PostgreSQL only: set PORTAL_TEST_DATABASE to run it")
    for item in items:
        if BACKEND != "postgresql" and "postgres_only" in item.keywords:
            item.add_marker(skip)
        if opens_no_test_database(item):
            item.add_marker(pytest.mark.no_database)


def _psycopg_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


class PostgresServer:
    """Creates and drops throwaway databases on the server PORTAL_TEST_DATABASE names."""

    def __init__(self, admin_url: str, prefix: str = "portal_test") -> None:
        self.admin_url = _psycopg_url(normalise_database_url(admin_url))
        self.prefix = prefix
        self.created: list[str] = []

    def url_for(self, name: str) -> str:
        base, _, _ = self.admin_url.rpartition("/")
        return normalise_database_url(f"{base}/{name}")

    def create(self, prefix: str | None = None) -> str:
        name = f"{prefix or self.prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return self.url_for(name)

    def drop(self, url: str) -> None:
        name = url.rpartition("/")[2]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.created:
            self.created.remove(name)

    def drop_run(self, run_id: str) -> list[str]:
        """Drop the databases whose names say they belong to run ``run_id``."""
        pattern = f"portal\\_test\\_{run_id}\\_%"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            names = [
                row[0]
                for row in conn.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE %s", (pattern,)
                )
            ]
            for name in names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return names


@pytest.fixture(scope="session")
def backend() -> str:
    return BACKEND


@pytest.fixture(scope="session")
def pg_server(pytestconfig: pytest.Config) -> Iterator[PostgresServer | None]:
    if BACKEND != "postgresql":
        yield None
        return
    server = PostgresServer(TEST_DATABASE, prefix=database_prefix(pytestconfig))
    yield server
    for name in list(server.created):
        server.drop(server.url_for(name))


@pytest.fixture(scope="session")
def fresh_database(pg_server: PostgresServer | None, tmp_path_factory: pytest.TempPathFactory):
    """A factory of new, empty databases on the backend under test (dropped afterwards)."""

    def make() -> str:
        if pg_server is not None:
            return pg_server.create()
        path = tmp_path_factory.mktemp("db") / f"{uuid.uuid4().hex}.sqlite3"
        return f"sqlite:///{path}"

    return make


@pytest.fixture(scope="session")
def _migrated_template(fresh_database) -> str:
    url = fresh_database()
    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()
    return url


def _empty_postgres(url: str) -> None:
    engine = create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        tables = [
            row[0]
            for row in conn.execute(
                sa.text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                    "AND tablename <> 'alembic_version'"
                )
            )
        ]
        if tables:
            # replica mode skips the triggers that guard append-only tables.
            conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
            conn.execute(
                sa.text(f"TRUNCATE {', '.join(f'{t!s}' for t in tables)} RESTART IDENTITY CASCADE")
            )
    engine.dispose()


@pytest.fixture
def database_url(_migrated_template: str, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database of this test's own."""
    if BACKEND == "postgresql":
        yield _migrated_template
        _empty_postgres(_migrated_template)
        return
    source = Path(_migrated_template.removeprefix("sqlite:///"))
    target = tmp_path / "portal.sqlite3"
    shutil.copyfile(source, target)
    yield f"sqlite:///{target}"


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


def make_settings(database_url: str, instance_path: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "env": "development",
        "instance_path": instance_path,
        "database_url": database_url,
        "secret_key": "t" * 48,
        "vapid_private_key": VAPID_PRIVATE,
        "vapid_public_key": VAPID_PUBLIC,
        "vapid_subject": "mailto:ops@example.test",
        "auth_keys": {1: base64.b64decode(KEY_V1)},
        "auth_key_version": 1,
        "push_allowed_hosts": (*DEFAULT_PUSH_HOSTS, "127.0.0.1:8443"),
        "scheduler": False,
        "feedback_secrets": ("feedback-secret-one",),
        "export_signing_key": EXPORT_SIGNING_KEY,
        "consent_log_signing_key": CONSENT_LOG_SIGNING_KEY,
        "auto_migrate": False,
        # Tests send many API requests from one address under a frozen clock; the
        # limits are tested on their own (tests/test_ratelimit.py) and in the browser.
        "rate_limit": RateLimitSettings(per_address=0, per_endpoint=0),
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(database_url, str(tmp_path / "instance"))


@pytest.fixture
def app(settings: Settings, clock: FrozenClock) -> Iterator[Flask]:
    application = create_app(settings, clock=clock)
    application.config["TESTING"] = True
    yield application
    application.extensions["portal.db"].engine.dispose()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def engine(app: Flask) -> sa.Engine:
    return app.extensions["portal.db"].engine


@pytest.fixture
def subscriptions() -> SubscriptionFactory:
    return SubscriptionFactory()


TOPICS = [
    # slug, category, transactional, default
    ("security-alerts", "Your account", True, "opt_in"),
    ("order-updates", "Your account", True, "opt_out"),
    ("weekly-digest", "News", False, "opt_in"),
    ("offers", "Offers", False, "opt_out"),
]


def publish_test_catalogue(app: Flask, now: dt.datetime) -> None:
    """Policy v1 and the four TOPICS (each class × each default), published at ``now``."""
    with db.begin(app) as session:
        catalogue.publish_policy(session, version="v1", text="We send what you choose.", now=now)
        for slug, category, transactional, default in TOPICS:
            catalogue.add_topic(
                session,
                slug=slug,
                category=category,
                label=slug.replace("-", " ").title(),
                description=f"About {slug}.",
                transactional=transactional,
                default_state=default,
                now=now,
            )


@pytest.fixture
def catalogue_ready(app, clock):
    """Four topics (each class × each default) and a published policy."""
    publish_test_catalogue(app, clock.now())
    return app
