"""Keyset-paginated batches over push subscriptions: the skeleton of the batch jobs on
the table (the ageing sweeps, tombstones, purge, re-sealing and the backfills)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, cast

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from portal.db import db, is_postgres
from portal.jobreport import JobReport, Progress
from portal.subscriptions.models import PushSubscription

_t = cast(sa.Table, PushSubscription.__table__)


def subscription_batches(
    app: Flask,
    candidates: sa.ColumnElement[bool],
    *,
    batch_size: int,
    progress: Progress,
    handle: Callable[[Session, Sequence[sa.Row[Any]]], int],
    stop: threading.Event | None,
    report: JobReport,
    columns: tuple[sa.ColumnElement[Any], ...] = (),
    appends_events: bool = False,
    between: Callable[[], bool] | None = None,
) -> None:
    """Walk the push subscriptions matching ``candidates`` by primary key (keyset
    pagination, never OFFSET), ``batch_size`` at a time, each batch in its own short
    transaction and claimed with SKIP LOCKED on PostgreSQL, so that several processes
    share the work and none handles a row twice. ``handle`` does the batch's work and
    returns how many rows it changed. Stops between batches once ``stop`` is set, or
    when ``between`` (called after every full batch: a backfill's pause and replication
    check) answers False; the next run picks up what is left. ``appends_events``: the
    batch's ``handle`` appends consent events (each follows a conditional UPDATE of its
    subscription's state, so no event is written twice; no global lock is taken).
    """
    with db.begin(app) as session:
        progress.start(session.execute(sa.select(sa.func.count()).where(candidates)).scalar_one())
    last_id: uuid.UUID | None = None
    while stop is None or not stop.is_set():
        with db.begin(app) as session:
            query = sa.select(_t.c.id, *columns).where(candidates)
            if last_id is not None:
                query = query.where(_t.c.id > last_id)
            query = query.order_by(_t.c.id).limit(batch_size)
            if is_postgres(session):
                query = query.with_for_update(skip_locked=True)
            rows = session.execute(query).all()
            if not rows:
                return
            report.changed += handle(session, rows)
            last_id = rows[-1].id
        report.processed += len(rows)
        progress.advance(len(rows))
        if len(rows) < batch_size:
            return  # a short batch is the last: no row after it is left unclaimed
        if between is not None and not between():
            return
