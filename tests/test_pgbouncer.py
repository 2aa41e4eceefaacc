"""Through a connection pooler in transaction mode (PgBouncer): the locks that coordinate
processes hold, and statements are never prepared on a server connection the next
transaction may not get.

The ``pgbouncer`` tests need ``PORTAL_TEST_DATABASE`` to name a PgBouncer in transaction
mode and ``PORTAL_TEST_DATABASE_ADMIN`` the PostgreSQL server behind it (``.ci/run``
starts one: ``.ci/pgbouncer``); elsewhere they skip. The others run on any PostgreSQL.
"""

from __future__ import annotations

import threading

import psycopg
import pytest
import sqlalchemy as sa

from portal import create_app
from portal.db import create_engine, held_transaction_lock
from portal.operations.scheduler import job_lock
from tests.conftest import ADMIN_DATABASE, TEST_DATABASE, _psycopg_url

THROUGH_POOLER = ADMIN_DATABASE != TEST_DATABASE
through_pooler = pytest.mark.skipif(
    not THROUGH_POOLER,
    reason="needs PORTAL_TEST_DATABASE to be a PgBouncer in front of PORTAL_TEST_DATABASE_ADMIN",
)


def _server(database_url: str) -> psycopg.Connection:
    """A connection straight to the server behind the pooler, to the test's database."""
    base, _, _ = _psycopg_url(ADMIN_DATABASE).rpartition("/")
    name = database_url.rpartition("/")[2]
    return psycopg.connect(f"{base}/{name}", autocommit=True)


def _advisory_locks(database_url: str) -> list[tuple]:
    with _server(database_url) as conn:
        return conn.execute(
            "SELECT l.classid, l.objid, l.pid FROM pg_locks l JOIN pg_database d "
            "ON d.oid = l.database WHERE l.locktype = 'advisory' AND d.datname = "
            "current_database()"
        ).fetchall()


@pytest.mark.postgres_only
@pytest.mark.pgbouncer
def test_a_job_lock_excludes_every_other_process_for_its_whole_run(settings, clock):
    """One process holds the sweep's lock while it works in transactions of its own;
    another process asks for it, again and again, and never gets it; once released it is
    gone from the server. Through PgBouncer a session lock fails this: the holder's
    server connection goes back to the pool with the lock on it, and the next client
    lent that connection is granted the lock (advisory locks are re-entrant per session),
    or the unlock lands on a connection that never held it and the lock stays."""
    holder_app = create_app(settings, clock=clock)
    other_app = create_app(settings, clock=clock)
    holder_engine = holder_app.extensions["portal.db"].engine
    inside, release = threading.Event(), threading.Event()
    granted_to_other: list[bool] = []

    def hold() -> None:
        with job_lock(holder_app, "sweep") as acquired:
            assert acquired
            inside.set()
            while not release.is_set():
                with holder_engine.begin() as conn:  # the job's own short transactions
                    conn.execute(sa.text("SELECT count(*) FROM push_subscription"))

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        for _ in range(30):
            with job_lock(other_app, "sweep") as acquired:
                granted_to_other.append(acquired)
    finally:
        release.set()
        holder.join(20)
    assert granted_to_other == [False] * 30
    assert _advisory_locks(settings.database_url) == []
    with job_lock(other_app, "sweep") as again:
        assert again is True
    for app in (holder_app, other_app):
        app.extensions["portal.db"].engine.dispose()


@pytest.mark.postgres_only
@pytest.mark.pgbouncer
def test_a_held_lock_holds_back_no_snapshot(database_url):
    """The transaction that holds a lock sits idle for the whole job or migration run: it
    must hold no snapshot, or an index built CONCURRENTLY by a migration under that very
    lock would wait for it for ever (and VACUUM would keep dead rows for it)."""
    engine = create_engine(database_url)
    try:
        with held_transaction_lock(engine, 1, 2, wait=False) as acquired:
            assert acquired
            with _server(database_url) as conn:
                holders = conn.execute(
                    "SELECT a.backend_xmin, a.backend_xid FROM pg_stat_activity a JOIN "
                    "pg_locks l ON l.pid = a.pid WHERE l.locktype = 'advisory' AND "
                    "a.datname = current_database()"
                ).fetchall()
            assert holders == [(None, None)]
    finally:
        engine.dispose()


@through_pooler
@pytest.mark.postgres_only
@pytest.mark.pgbouncer
def test_the_same_statement_run_many_times_from_two_processes(settings, clock):
    """psycopg prepares a statement on the server the fifth time a connection runs it;
    through PgBouncer the sixth may run on a server connection that never saw it, or a
    second client's prepare collide with the first's on one server connection."""
    apps = [create_app(settings, clock=clock) for _ in range(2)]
    engines = [app.extensions["portal.db"].engine for app in apps]
    try:
        for _ in range(12):
            for engine in engines:
                with engine.begin() as conn:
                    conn.execute(
                        sa.text("SELECT count(*) FROM push_subscription WHERE state = :s"),
                        {"s": "active"},
                    ).scalar_one()
    finally:
        for engine in engines:
            engine.dispose()
