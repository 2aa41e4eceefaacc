"""Keyset-paginated batches over one table: the skeleton of every batch job (the ageing
sweeps, tombstones, purge, re-sealing, the backfills, and the retention of the bounded
tables)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from portal.db import affected_rows, db, is_postgres
from portal.jobreport import JobReport, Progress


def keyset_batches(
    app: Flask,
    table: sa.Table,
    candidates: sa.ColumnElement[bool],
    *,
    batch_size: int,
    progress: Progress,
    handle: Callable[[Session, Sequence[sa.Row[Any]]], int],
    stop: threading.Event | None,
    report: JobReport,
    key: sa.ColumnElement[Any] | None = None,
    columns: tuple[sa.ColumnElement[Any], ...] = (),
    between: Callable[[], bool] | None = None,
) -> None:
    """Walk the rows of ``table`` matching ``candidates`` by ``key`` (its primary key
    unless told; keyset pagination, never OFFSET), ``batch_size`` at a time, each batch
    in its own short transaction and claimed with SKIP LOCKED on PostgreSQL, so that
    several processes share the work and none handles a row twice. ``handle`` does the
    batch's work and returns how many rows it changed; each row carries the key as
    ``key``. Stops between batches once ``stop`` is set, or when ``between`` (called after
    every full batch: a backfill's pause and replication check) answers False; the next
    run picks up what is left. A ``handle`` that appends consent events needs no lock
    of the log's: each event follows a conditional UPDATE of its row's state, so none is
    written twice.
    """
    if key is None:
        (key,) = table.primary_key.columns
    with db.begin(app) as session:
        progress.start(
            session.execute(
                sa.select(sa.func.count()).select_from(table).where(candidates)
            ).scalar_one()
        )
    last: Any = None
    while stop is None or not stop.is_set():
        with db.begin(app) as session:
            query = sa.select(key.label("key"), *columns).where(candidates)
            if last is not None:
                query = query.where(key > last)
            query = query.order_by(key).limit(batch_size)
            if is_postgres(session):
                query = query.with_for_update(skip_locked=True)
            rows = session.execute(query).all()
            if not rows:
                return
            report.changed += handle(session, rows)
            last = rows[-1].key
        report.processed += len(rows)
        progress.advance(len(rows))
        if len(rows) < batch_size:
            return  # a short batch is the last: no row after it is left unclaimed
        if between is not None and not between():
            return


def delete_batches(
    app: Flask,
    table: sa.Table,
    candidates: sa.ColumnElement[bool],
    *,
    batch_size: int,
    progress: Progress,
    stop: threading.Event | None,
    report: JobReport,
) -> None:
    """Delete the rows of ``table`` matching ``candidates`` in keyset batches
    (:func:`keyset_batches`); each batch deletes only rows that still match."""
    (key,) = table.primary_key.columns

    def delete(session: Session, rows: Sequence[sa.Row[Any]]) -> int:
        return affected_rows(
            session, sa.delete(table).where(key.in_([row.key for row in rows]), candidates)
        )

    keyset_batches(
        app,
        table,
        candidates,
        batch_size=batch_size,
        progress=progress,
        handle=delete,
        stop=stop,
        report=report,
    )


def replication_lag_seconds(session: Session) -> float:
    """How far the slowest streaming replica is behind this primary (0 without replicas)."""
    if not is_postgres(session):
        return 0.0
    lag = session.execute(
        sa.text("SELECT EXTRACT(EPOCH FROM max(replay_lag)) FROM pg_stat_replication")
    ).scalar_one()
    return float(lag or 0.0)


def replication_throttle(
    app: Flask,
    report: JobReport,
    *,
    pause_seconds: float,
    max_lag_seconds: float | None,
    lag: Callable[[Session], float] = replication_lag_seconds,
    sleep: Callable[[float], None] = time.sleep,
) -> Callable[[], bool]:
    """What a long batch job does between chunks (:func:`keyset_batches`' ``between``: the
    backfills, the delivery fold): stop,
    saying so in ``report``, when replication lag is over ``max_lag_seconds``; otherwise
    sleep ``pause_seconds`` and go on."""

    def between() -> bool:
        if max_lag_seconds is not None:
            with db.begin(app) as session:
                behind = lag(session)
            if behind > max_lag_seconds:
                report.problems.append(
                    f"stopped after {report.processed} rows: replication lag {behind:.1f} s "
                    f"is over {max_lag_seconds:g} s; run the job again to go on"
                )
                return False
        sleep(pause_seconds)
        return True

    return between
