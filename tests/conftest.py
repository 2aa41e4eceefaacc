"""Test fixtures: a migrated database per run (SQLite or PostgreSQL), an app per test.

``PORTAL_TEST_DATABASE`` chooses the backend. Unset: SQLite, a migrated template file
copied afresh for every test. A PostgreSQL URL: a fresh database created on that server for
the run, migrated, emptied after every test and dropped at the end. Behind a connection
pooler (PgBouncer in transaction mode, ``.ci/pgbouncer``), ``PORTAL_TEST_DATABASE`` names
the pooler and ``PORTAL_TEST_DATABASE_ADMIN`` the server itself: the test databases are
created and dropped there, straight on PostgreSQL, and the application reaches them
through the pooler (whose ``*`` entry passes any database name through).

Under pytest-xdist (``-n auto``) every worker is a run of its own: its own template
file in its own temporary folder on SQLite, its own databases on PostgreSQL, named
``portal_test_<run>_<worker>_<random>``. The controller drops whatever databases of its
run are left when the run ends (a worker that crashed cannot drop its own), and passing
runs leave no temporary folder (``tmp_path_retention_policy = "failed"``).
"""

from __future__ import annotations

import base64
import datetime as dt
import importlib
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import psycopg
import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import settings as hypothesis_settings
from werkzeug.routing.rules import Rule

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

# The module itself: the package's ``db`` attribute is the extension, not this module.
portal_db = importlib.import_module("portal.db")

TEST_DATABASE = os.environ.get("PORTAL_TEST_DATABASE", "").strip()
# Where the test databases are created and dropped: the server itself (the same as
# TEST_DATABASE unless that is a pooler).
ADMIN_DATABASE = os.environ.get("PORTAL_TEST_DATABASE_ADMIN", "").strip() or TEST_DATABASE
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


class SharedTemplateCode(jinja2.BytecodeCache):
    """Every app of a test process compiles each template once, not once per app.

    Each test makes its own app, and each app its own Jinja environment, which parsed and
    compiled every template it rendered again: about a third of the CPU time of a test
    that renders a few pages. Jinja keeps a compiled template here under its name with the
    checksum of its source, so an edited template is compiled afresh; every app of the
    portal builds the same environment, so the code is the same.
    """

    def __init__(self) -> None:
        self.code: dict[str, bytes] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        if (code := self.code.get(bucket.key)) is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self.code[bucket.key] = bucket.bytecode_to_string()


Flask.jinja_options = {**Flask.jinja_options, "bytecode_cache": SharedTemplateCode()}


_compile_url_builder = Rule._compile_builder
_url_builders: dict[tuple[object, ...], Any] = {}


def _shared_url_builder(self: Rule, append_unknown: bool = True) -> Any:
    """Every app of a test process compiles each route's URL builder once.

    Werkzeug writes and compiles two small Python functions for every route of every
    app (``url_for``'s builders): four fifths of the CPU time of ``create_app``, which
    every test calls. A builder is made from the rule's text, its parts, its defaults and
    its converters' types alone, and reads everything else from the rule it is bound to
    (``Rule.compile`` binds it), so one builder serves every app's copy of a route.
    """
    key = (
        self.rule,
        tuple(self._trace),
        repr(sorted((self.defaults or {}).items())),
        tuple((name, type(converter)) for name, converter in self._converters.items()),
        append_unknown,
    )
    if (builder := _url_builders.get(key)) is None:
        builder = _url_builders[key] = _compile_url_builder(self, append_unknown)
    return builder


Rule._compile_builder = _shared_url_builder  # type: ignore[method-assign]


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
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the CPUs this process may run on.

    Many tests wait on other processes (three dispatchers, a scheduler, a push service
    that answers slowly, Chromium): with a worker per CPU a third of the CPU time of the
    PostgreSQL pass went unused. Measured on 2 CPUs: the PostgreSQL pass took 312 s with
    2 workers and 270 s with 3; SQLite with the browser tests 525 s and 494 s.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still sets the number."""
    if chosen := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip():
        return int(chosen)
    return len(os.sched_getaffinity(0)) + 1


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, in the controller: each worker learns the run's id."""
    node.workerinput[RUN_ID_KEY] = node.config.stash[_RUN_ID]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the controller (or a run without workers): drop every database of this run
    still on the server, whichever worker made it."""
    if BACKEND != "postgresql" or hasattr(session.config, "workerinput"):
        return
    PostgresServer(ADMIN_DATABASE, app_url=TEST_DATABASE).drop_run(session.config.stash[_RUN_ID])


def database_prefix(config: pytest.Config) -> str:
    return f"portal_test_{config.stash[_RUN_ID]}_{WORKER}"


# The fixtures through which a test reaches the database PORTAL_TEST_DATABASE chooses.
DATABASE_FIXTURES = frozenset(
    {
        "backend",
        "pg_server",
        "fresh_database",
        "_migrated_template",
        "_shared_engine",
        "database_url",
    }
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
    """Creates and drops throwaway databases on the server ``admin_url`` names; the URLs
    it hands out reach them the way ``app_url`` does (a pooler in front of that server)."""

    def __init__(
        self, admin_url: str, prefix: str = "portal_test", *, app_url: str | None = None
    ) -> None:
        self.admin_url = _psycopg_url(normalise_database_url(admin_url))
        self.app_url = _psycopg_url(normalise_database_url(app_url or admin_url))
        self.prefix = prefix
        self.created: list[str] = []

    def url_for(self, name: str) -> str:
        base, _, _ = self.app_url.rpartition("/")
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
    server = PostgresServer(
        ADMIN_DATABASE, prefix=database_prefix(pytestconfig), app_url=TEST_DATABASE
    )
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


# Empties every table but alembic_version and restarts every sequence, in one round trip.
# Replica mode skips the triggers that guard append-only tables and the foreign keys' own
# triggers, so the order does not matter. DELETE, not TRUNCATE: TRUNCATE gives each of the
# 22 tables and its indexes new files, which cost the server 1.2 s per test (wall-clock at
# load average 19-23) against 0.12 s for DELETE on tables that hold a test's few rows.
_EMPTY_POSTGRES = """
DO $$
DECLARE r record;
BEGIN
  SET LOCAL session_replication_role = replica;
  FOR r IN SELECT tablename FROM pg_tables
           WHERE schemaname = 'public' AND tablename <> 'alembic_version' LOOP
    EXECUTE 'DELETE FROM public.' || quote_ident(r.tablename);
  END LOOP;
  FOR r IN SELECT sequencename FROM pg_sequences WHERE schemaname = 'public' LOOP
    EXECUTE 'ALTER SEQUENCE public.' || quote_ident(r.sequencename) || ' RESTART';
  END LOOP;
END $$
"""


def _empty_postgres(engine: sa.Engine) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql(_EMPTY_POSTGRES)


def _shared_url(template: str) -> str:
    """The database every test of this process runs on: on PostgreSQL the run's database
    (emptied after each test), on SQLite one file beside the template (a fresh copy of it
    for each test)."""
    if BACKEND == "postgresql":
        return template
    folder = Path(template.removeprefix("sqlite:///")).parent / "shared"
    folder.mkdir(exist_ok=True)
    return f"sqlite:///{folder / 'portal.sqlite3'}"


@pytest.fixture(scope="session")
def _shared_engine(_migrated_template: str) -> Iterator[sa.Engine]:
    """Every application a test process makes on its test database reaches it through
    one engine, as the requests of one web process do: its compiled statements (and on
    PostgreSQL its pooled connections, the server's backends with their catalogue
    caches) outlive a test, which otherwise paid to make them afresh (on PostgreSQL about
    a third of a test's time, on SQLite a fifth).

    Nothing a test does stays on a connection: the application sets only transaction-local
    settings and takes only transaction-level locks (the rule that lets PgBouncer's
    transaction mode hand a connection to the next client); on PostgreSQL the tables are
    emptied after every test, on SQLite the pool is closed and the file copied afresh
    from the template. A test's ``dispose()`` of its application's engine leaves this
    one as it is; it is disposed when the run ends. An application with settings of
    another database, timeout or statement preparation gets an engine of its own."""
    shared: dict[tuple[object, ...], sa.Engine] = {}
    own_engine = portal_db.engine_for
    url = _shared_url(_migrated_template)
    with pytest.MonkeyPatch.context() as patch:

        def engine_for(settings: Settings) -> sa.Engine:
            if normalise_database_url(settings.database_url) != normalise_database_url(url):
                return own_engine(settings)
            key = (settings.database_connect_timeout, settings.database_prepared_statements)
            if key not in shared:
                shared[key] = own_engine(settings)
                patch.setattr(shared[key], "dispose", lambda close=True: None)
            return shared[key]

        patch.setattr(portal_db, "engine_for", engine_for)
        yield engine_for(make_settings(url, ""))
    for engine in shared.values():
        engine.dispose()


def _close_pools(engine: sa.Engine) -> None:
    """Close the shared engine's pooled connections (its own dispose, which tests' calls
    of ``dispose()`` do not reach), keeping its compiled statements."""
    type(engine).dispose(engine)


@pytest.fixture
def database_url(_shared_engine: sa.Engine, _migrated_template: str) -> Iterator[str]:
    """A migrated, empty database for this test alone."""
    url = _shared_url(_migrated_template)
    if BACKEND == "postgresql":
        yield url
        _empty_postgres(_shared_engine)
        return
    target = Path(url.removeprefix("sqlite:///"))
    _close_pools(_shared_engine)
    for name in (target, Path(f"{target}-wal"), Path(f"{target}-shm")):
        name.unlink(missing_ok=True)
    shutil.copyfile(Path(_migrated_template.removeprefix("sqlite:///")), target)
    yield url
    _close_pools(_shared_engine)


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture(autouse=True)
def _progress_readings_never_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The campaign page's progress readings (portal/campaigns/readings.py) are kept when
    one took longer than ``REUSE_ABOVE`` of real time: on a loaded machine any reading
    may, and a page opened again then shows the earlier figures, not what the test has
    changed since (a circuit closed by the test's clock: it failed a CI run). Timed on a
    clock that never moves, none is kept; the tests of keeping them set their own
    (``tests/campaigns/test_readings.py``)."""
    from portal.campaigns import views
    from portal.campaigns.readings import CostlyReadings

    monkeypatch.setattr(views, "_READINGS", CostlyReadings(lambda: 0.0))
    # The audience counts likewise (a review page, its test sends, the launch).
    monkeypatch.setattr(views, "_AUDIENCES", CostlyReadings(lambda: 0.0))


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
