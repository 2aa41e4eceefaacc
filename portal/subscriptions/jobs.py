"""Registry maintenance jobs: re-sealing under the current key, repairing endpoint hashes.

Both walk the table by primary key (keyset pagination, never OFFSET) in short
transactions, so they can be stopped at any point and run again: each batch that
committed is done, and the next run picks up what is left.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, cast

import sqlalchemy as sa
from flask import Flask
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from portal.db import affected_rows, db, is_postgres
from portal.jobs import JobReport, Progress, job
from portal.subscriptions.batches import subscription_batches
from portal.subscriptions.models import PushSubscription
from portal.subscriptions.sealing import KeyRing, SealBroken, UnknownKeyVersion
from portal.subscriptions.validation import endpoint_hash

_t = cast(sa.Table, PushSubscription.__table__)


def reseal(
    app: Flask,
    keys: KeyRing,
    *,
    batch_size: int,
    progress: Progress,
    stop: threading.Event | None = None,
) -> JobReport:
    """Move every sealed auth secret to the current key version.

    A row whose version has no key (or whose seal does not open) is reported and left
    as it is; every other row still moves. With ``stop`` set (the scheduler shutting
    down) it returns after the batch in hand; the next run moves the rest.
    """
    report = JobReport("reseal")
    current = keys.current_version

    def move(session: Session, rows: Sequence[sa.Row[Any]]) -> int:
        changed = 0
        for row in rows:
            try:
                secret = keys.open(row.auth_sealed, row.auth_key_version)
            except (UnknownKeyVersion, SealBroken) as problem:
                report.problems.append(f"subscription {row.id}: {problem}")
                continue
            sealed = keys.seal(secret)
            changed += affected_rows(
                session,
                sa.update(_t)
                .where(
                    _t.c.id == row.id,
                    _t.c.auth_key_version == row.auth_key_version,
                    _t.c.auth_sealed == row.auth_sealed,
                )
                .values(auth_sealed=sealed.sealed, auth_key_version=sealed.key_version),
            )
        return changed

    # Another re-seal run (another process) takes other rows meanwhile: SKIP LOCKED.
    subscription_batches(
        app,
        (_t.c.auth_sealed.is_not(None)) & (_t.c.auth_key_version != current),
        batch_size=batch_size,
        progress=progress,
        handle=move,
        stop=stop,
        report=report,
        columns=(_t.c.auth_sealed, _t.c.auth_key_version),
    )
    return report


def replication_lag_seconds(session: Session) -> float:
    """How far the slowest streaming replica is behind this primary (0 without replicas)."""
    if not is_postgres(session):
        return 0.0
    lag = session.execute(
        sa.text("SELECT EXTRACT(EPOCH FROM max(replay_lag)) FROM pg_stat_replication")
    ).scalar_one()
    return float(lag or 0.0)


def backfill_endpoint_hash(
    app: Flask,
    *,
    batch_size: int,
    progress: Progress,
    pause_seconds: float = 0.0,
    max_lag_seconds: float | None = None,
    lag: Callable[[Session], float] = replication_lag_seconds,
    sleep: Callable[[float], None] = time.sleep,
) -> JobReport:
    """Make every live row's ``endpoint_hash`` the SHA-256 of its endpoint.

    The repair half of an online hash migration (migrations/README.md): rows written
    before the column existed, or under an older algorithm, get the right digest. A row
    whose endpoint already belongs to another row is reported, never merged. Between
    chunks it sleeps ``pause_seconds`` and stops (reporting it; run it again to go on)
    when replication lag is over ``max_lag_seconds``.
    """
    report = JobReport("backfill-hash")
    has_endpoint = _t.c.endpoint.is_not(None)
    with db.begin(app) as session:
        progress.start(session.execute(sa.select(sa.func.count()).where(has_endpoint)).scalar_one())
    last_id: uuid.UUID | None = None
    while True:
        with db.begin(app) as session:
            query = sa.select(_t.c.id, _t.c.endpoint, _t.c.endpoint_hash).where(has_endpoint)
            if last_id is not None:
                query = query.where(_t.c.id > last_id)
            rows = session.execute(query.order_by(_t.c.id).limit(batch_size)).all()
            if not rows:
                break
            for row in rows:
                digest = endpoint_hash(row.endpoint)
                if row.endpoint_hash == digest:
                    continue
                try:
                    with session.begin_nested():
                        session.execute(
                            sa.update(_t).where(_t.c.id == row.id).values(endpoint_hash=digest)
                        )
                    report.changed += 1
                except IntegrityError:
                    report.problems.append(
                        f"subscription {row.id}: its endpoint is already stored on another row"
                    )
            last_id = rows[-1].id
        report.processed += len(rows)
        progress.advance(len(rows))
        if len(rows) < batch_size:
            break
        if max_lag_seconds is not None:
            with db.begin(app) as session:
                behind = lag(session)
            if behind > max_lag_seconds:
                report.problems.append(
                    f"stopped after {report.processed} rows: replication lag {behind:.1f} s is "
                    f"over {max_lag_seconds:g} s; run the job again to go on"
                )
                break
        sleep(pause_seconds)
    return report


@job("reseal")
def _reseal_job(app: Flask, progress: Progress) -> JobReport:
    portal = app.extensions["portal"]
    return reseal(
        app,
        portal.keys,
        batch_size=portal.settings.reseal_batch_size,
        progress=progress,
        stop=app.extensions.get("portal.stop"),
    )


@job("backfill-hash")
def _backfill_job(app: Flask, progress: Progress) -> JobReport:
    portal = app.extensions["portal"]
    settings = portal.settings
    return backfill_endpoint_hash(
        app,
        batch_size=settings.reseal_batch_size,
        progress=progress,
        pause_seconds=settings.backfill_pause_seconds,
        max_lag_seconds=settings.backfill_max_replication_lag_seconds,
    )
