"""The database: engine, sessions, the model base and the types shared by every package."""

from __future__ import annotations

import datetime as dt
import logging
import os
import stat
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psycopg
import sqlalchemy as sa
import sqlalchemy.exc
from flask import Flask, current_app, g
from sqlalchemy import event
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from portal.config import Settings

log = logging.getLogger("portal")

# What a database that is down, restarting or unreachable raises (SQLAlchemy wraps the
# driver's errors; the driver's own escape when it is called directly). A pool with no
# free connection left is the same condition seen from this process.
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(sa.types.TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every database.

    SQLite has no timezone type and hands back naive values; this stores UTC and always
    returns aware datetimes, so comparisons never mix naive and aware values.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: sa.Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given where an aware UTC one is required")
        value = value.astimezone(dt.UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


# The last (milliseconds, fraction of a millisecond) this process gave uuid7() for "now".
_last_uuid7 = [0, 0]
_uuid7_lock = threading.Lock()


def uuid7(at: dt.datetime | None = None) -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7): new rows land at the end of the index.
    Its time is now, or ``at`` (a campaign's id places its deliveries in that month's
    partition on PostgreSQL: portal/delivery/partitions.py).

    The ids a process makes for "now" increase even within one millisecond, so that of
    two rows made in turn the first has the smaller id (the order in which two campaigns
    made in one millisecond are materialised and meet a frequency cap is the order they
    were made in): the 12 bits after the milliseconds hold the fraction of a millisecond
    (RFC 9562 §6.2, method 3), one more than the last id's when the clock has not moved
    on. The 62 bits after them stay random, whatever the clock does: a campaign splits
    its audience into variants by one of their bytes (portal/campaigns/variants.py)."""
    rand_b = int.from_bytes(uuid.uuid4().bytes[8:], "big") & ((1 << 62) - 1)
    if at is None:
        nanos = time.time_ns()
        millis, fraction = divmod(nanos, 1_000_000)
        fraction = fraction * 4096 // 1_000_000
        with _uuid7_lock:
            last_millis, last_fraction = _last_uuid7
            if (millis, fraction) <= (last_millis, last_fraction):
                millis, fraction = last_millis, last_fraction + 1
                if fraction == 4096:  # 4,096 ids in one millisecond: borrow the next
                    millis, fraction = millis + 1, 0
            _last_uuid7[:] = millis, fraction
    else:
        millis = int(at.timestamp() * 1000)
        fraction = int.from_bytes(uuid.uuid4().bytes[:2], "big") & 0xFFF
    value = (millis & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= fraction << 64
    value |= 0b10 << 62
    value |= rand_b
    return uuid.UUID(int=value)


def create_engine(
    url: str, *, connect_timeout: int = 5, prepared_statements: bool = False, **kwargs: Any
) -> Engine:
    """An engine for ``url``. On PostgreSQL a connection attempt gives up after
    ``connect_timeout`` seconds and dead connections are found by keepalives and a ping at
    checkout of a connection that sat idle, so a database outage fails requests quickly
    instead of hanging them. No statement is prepared on the server unless
    ``prepared_statements`` (``DATABASE_PREPARED_STATEMENTS``): through PgBouncer in
    transaction mode the next transaction may run on a server connection that never saw
    it."""
    # Statement parameters carry stored data (keys, endpoints, hashes): never in logs or
    # in the text of database errors, whatever logging an operator turns on.
    kwargs.setdefault("hide_parameters", True)
    if url.startswith("sqlite"):
        _private_sqlite_file(url)
        engine = sa.create_engine(
            url, connect_args={"timeout": 30, "check_same_thread": False}, **kwargs
        )
        _configure_sqlite(engine)
        return engine
    connect_args = {
        "connect_timeout": connect_timeout,
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 10,
        "keepalives_count": 3,
        # psycopg's own default is 5 (prepare on the fifth run); None never prepares.
        "prepare_threshold": 5 if prepared_statements else None,
    }
    connect_args.update(kwargs.pop("connect_args", {}))
    kwargs["connect_args"] = connect_args
    if "poolclass" not in kwargs:
        kwargs.setdefault("pool_size", 10)
        kwargs.setdefault("max_overflow", 20)
    engine = sa.create_engine(url, **kwargs)
    if not kwargs.get("pool_pre_ping"):
        _ping_idle_connections(engine)
    return engine


def engine_for(settings: Settings) -> Engine:
    """The engine an application of ``settings`` reaches its database through."""
    return create_engine(
        settings.database_url,
        connect_timeout=settings.database_connect_timeout,
        prepared_statements=settings.database_prepared_statements,
    )


# A connection back in the pool for longer than this is pinged before it is handed out.
IDLE_PING_SECONDS = 5.0


def _ping_idle_connections(engine: Engine) -> None:
    """Ping at checkout only a connection that sat idle in the pool.

    A ping on every checkout costs a round trip per request. A connection in steady use
    needs none: when the server goes away under it, the failing statement is a disconnect
    error, which invalidates every pooled connection (and the view answers 503), so the
    next checkouts connect afresh. The ping remains for connections that were idle while
    the server restarted, which would otherwise fail the first request after it.
    """

    @event.listens_for(engine.pool, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["portal_idle_since"] = time.monotonic()

    @event.listens_for(engine.pool, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("portal_idle_since")
        if idle_since is None or time.monotonic() - idle_since < IDLE_PING_SECONDS:
            return
        try:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("SELECT 1")
            finally:
                cursor.close()
            dbapi_connection.rollback()
        except Exception as error:
            # The pool discards this connection and checks out (or makes) another.
            raise sa.exc.DisconnectionError(type(error).__name__) from error


def _private_sqlite_file(url: str) -> None:
    """Create the SQLite file 0600 before SQLite opens it (or take an existing one of
    ours down to 0600): it holds sealed keys, endpoints and people's choices. SQLite gives
    the WAL and its shared-memory index the database file's own permissions."""
    database = sa.engine.make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if not path.parent.is_dir():
        return  # SQLite reports the missing folder itself, as a database that is down
    for candidate, create in (
        (path, True),
        (Path(f"{path}-wal"), False),
        (Path(f"{path}-shm"), False),
    ):
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        try:
            fd = os.open(candidate, flags, 0o600)
        except OSError:
            continue  # absent, or not ours to open: SQLite says so if it matters
        try:
            info = os.fstat(fd)
            if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when a transaction starts.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA busy_timeout = 30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        # Take the write lock up front: every transaction is serialised, so a
        # read-then-write never fails half-way with SQLITE_BUSY, and appends that
        # must be ordered (the consent chain, claims) are ordered.
        connection.exec_driver_sql("BEGIN IMMEDIATE")


# How often a process waiting for a held lock (``held_transaction_lock(wait=True)``)
# asks again.
LOCK_POLL_SECONDS = 0.25


@contextmanager
def held_transaction_lock(engine: Engine, *key: int, wait: bool) -> Iterator[bool]:
    """Hold a PostgreSQL advisory lock for the block, across any number of transactions
    the block commits on other connections; yields whether it was acquired.

    The lock is transaction-level (``pg_try_advisory_xact_lock``), taken by a transaction
    on a connection of its own that stays open, idle, for the whole block and is rolled
    back at its end. A session-level lock would be held by whichever server connection a
    pooler in transaction mode (PgBouncer) lent for that one statement, and released, or
    not, on another: this one lives and ends with its transaction, which such a pooler
    keeps on one server connection from BEGIN to ROLLBACK. A holder that dies takes its
    transaction, and the lock, with it. The idle transaction holds no snapshot and no
    transaction id (it only ever takes the lock), so it holds back neither VACUUM nor an
    index built CONCURRENTLY; a server-wide ``idle_in_transaction_session_timeout`` is
    turned off for it, as ending it would free the lock under a running holder.

    ``wait``: when another process holds the lock, ask again every ``LOCK_POLL_SECONDS``
    until it is free (each attempt a short transaction of its own: a waiter holds no
    server connection and no snapshot while it waits); otherwise yield False at once.
    """
    function = (
        sa.func.pg_try_advisory_xact_lock(*key)
        if len(key) == 2
        else sa.func.pg_try_advisory_xact_lock(key[0])
    )
    with engine.connect() as connection:
        while True:
            acquired = bool(connection.execute(sa.select(function)).scalar_one())
            if acquired or not wait:
                break
            connection.rollback()
            time.sleep(LOCK_POLL_SECONDS)
        if not acquired:
            connection.rollback()
            yield False
            return
        # A statement after the lock's own: until the next one, the server keeps the
        # lock query's portal, and with it a snapshot that an index built CONCURRENTLY
        # (a migration) would wait for behind this very lock.
        connection.exec_driver_sql("SET LOCAL idle_in_transaction_session_timeout = 0")
        try:
            yield True
        finally:
            try:
                connection.rollback()
            except DATABASE_UNAVAILABLE:
                # The server or the connection went away: the lock went with them, and
                # the connection must not go back to the pool.
                connection.invalidate()


def is_postgres(bind: sa.Connection | Session | Engine) -> bool:
    if isinstance(bind, Session):
        return bind.get_bind().dialect.name == "postgresql"
    return bind.dialect.name == "postgresql"


def among(
    session: Session, column: sa.ColumnElement[Any], values: Iterable[Any]
) -> sa.ColumnElement[bool]:
    """``column IN values``, which PostgreSQL gets as one array parameter (``= ANY(:a)``):
    a batch's IN lists of 500 placeholders cost the sender more CPU to render and convert
    than they cost the database to run."""
    values = list(values)
    if is_postgres(session):
        return column == sa.any_(sa.bindparam(None, values, type_=postgresql.ARRAY(column.type)))
    return column.in_(values)


def without_jit(session: Session) -> None:
    """No JIT compilation for the rest of this transaction, on PostgreSQL.

    PostgreSQL compiles a statement whose estimated cost passes ``jit_above_cost``; for
    the campaign page's funnel, read every 5 s while a campaign sends, compiling took
    about 2 s of a 2.1 s statement at 20,000 deliveries (bench/funnel.py). ``SET LOCAL``
    ends with the transaction, so it holds behind PgBouncer in transaction mode too."""
    if is_postgres(session):
        session.execute(sa.text("SET LOCAL jit = off"))


def affected_rows(session: Session, statement: sa.Executable) -> int:
    """Execute an INSERT, UPDATE or DELETE; the number of rows it wrote (or matched).

    ``Session.execute`` is typed as returning a plain ``Result``; for these statements it
    is a ``CursorResult``, which carries the count. SQLAlchemy keeps the count of an
    UPDATE or DELETE only, unless told to: without ``preserve_rowcount`` an INSERT's count
    is -1 on PostgreSQL (psycopg forgets it when the cursor closes) and right on SQLite.
    """
    result = session.execute(statement, execution_options={"preserve_rowcount": True})
    return cast(sa.CursorResult[Any], result).rowcount


@dataclass
class _State:
    engine: Engine
    session_factory: sessionmaker[Session]


class Database:
    """Flask extension: an engine per application, a session per application context.

    The state lives in ``app.extensions`` so several applications (tests, a job runner
    beside a web app) never share an engine by accident.
    """

    def init_app(self, app: Flask, settings: Settings) -> None:
        engine = engine_for(settings)
        app.extensions["portal.db"] = _State(engine, sessionmaker(engine, expire_on_commit=False))
        app.teardown_appcontext(self._teardown)

    @staticmethod
    def _state(app: Flask | None = None) -> _State:
        return (app or current_app).extensions["portal.db"]

    @property
    def engine(self) -> Engine:
        return self._state().engine

    @property
    def session(self) -> Session:
        """The session of the current application context."""
        session = g.get("_portal_session")
        if session is None:
            session = self._state().session_factory()
            g._portal_session = session
        return session

    @contextmanager
    def begin(self, app: Flask | None = None) -> Iterator[Session]:
        """A fresh session in its own transaction, for jobs and scripts."""
        with self._state(app).session_factory() as session, session.begin():
            yield session

    def session_factory(self, app: Flask | None = None) -> sessionmaker[Session]:
        return self._state(app).session_factory

    @staticmethod
    def discard_session() -> None:
        """Drop the current context's session after a database failure: its connections
        are invalidated rather than returned to the pool, so the next checkout makes a new
        one, and whatever it had not committed is gone with them."""
        session = g.pop("_portal_session", None)
        if session is not None:
            session.invalidate()

    @staticmethod
    def _teardown(_exc: BaseException | None) -> None:
        session = g.pop("_portal_session", None)
        if session is None:
            return
        try:
            session.close()
        except DATABASE_UNAVAILABLE as error:
            # The database went away after the view's work was done (and committed, if it
            # wrote): closing rolls back what the server has rolled back already. The answer
            # stands; the connection must not go back to the pool.
            session.invalidate()
            log.warning("database unavailable while closing a session (%s)", type(error).__name__)

    def dispose(self, app: Flask) -> None:
        self._state(app).engine.dispose()


db = Database()
