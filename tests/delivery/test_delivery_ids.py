"""A delivery's id is the deliveryId its notification carries: never handed out twice."""

from __future__ import annotations

import datetime as dt
import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.campaigns.models import Campaign
from portal.db import create_engine, db
from portal.delivery.models import Delivery, DeliveryReceipt
from portal.jobs import run_job
from portal.migrate import downgrade, upgrade
from tests.helpers import record_delivery, subscribe_browser


def test_a_late_click_on_a_folded_delivery_never_counts_for_a_later_campaign(
    app, client, clock, subscriptions, backend
):
    """The newest deliveries are folded away (retention: SQLite deletes the rows,
    PostgreSQL drops a month's partition); the next campaign's ids are new ones, so the
    old notification's click is refused, not counted for that campaign."""
    subscription_id = subscribe_browser(app, client, subscriptions())
    with db.begin(app) as session:
        old_id = record_delivery(session, subscription_id, now=clock.now())
        old = session.scalars(sa.select(Campaign)).one()
        old.status, old.finished_at = "completed", clock.now()
    shown = client.post("/api/push/receipt", json={"deliveryId": old_id, "event": "shown"})
    assert shown.status_code == 201
    clock.advance(days=14 * 31)  # past DELIVERY_RETENTION_MONTHS (13 by default)
    run_job(app, "table-retention")
    with db.begin(app) as session:
        if backend == "postgresql":
            # The campaign's month is the real one (its id's time), not yet due to drop.
            session.execute(sa.delete(Delivery))
        assert session.scalars(sa.select(Delivery.id)).all() == []
        new_id = record_delivery(session, subscription_id, now=clock.now())
    assert int(new_id) > int(old_id)
    late = client.post("/api/push/receipt", json={"deliveryId": old_id, "event": "clicked"})
    assert late.status_code == 403


def _deliveries_then_the_newest_deleted(engine) -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with Session(engine) as session, session.begin():
        for number in (1, 2, 3):
            record_delivery(session, uuid.uuid4(), now=now, delivery_id=number)
        session.add(DeliveryReceipt(delivery_id="3", event="shown", at=now))
        session.add(DeliveryReceipt(delivery_id="not-ours", event="shown", at=now))
        session.flush()
        session.execute(sa.delete(Delivery).where(Delivery.id.in_([2, 3])))


def test_the_migration_starts_sqlite_past_every_id_still_known(fresh_database, backend):
    """Delivery 3 was deleted before the migration, but its receipt still names it: the
    next delivery is 4, not 2 again; the rows, indexes and constraints are kept, and the
    migration goes back and forth."""
    if backend != "sqlite":
        return  # PostgreSQL: a sequence, which never goes back (tested above)
    engine = create_engine(fresh_database())
    try:
        upgrade(engine, "0031")
        _deliveries_then_the_newest_deleted(engine)
        indexes = {i["name"] for i in sa.inspect(engine).get_indexes("delivery")}
        upgrade(engine)
        assert {i["name"] for i in sa.inspect(engine).get_indexes("delivery")} == indexes
        with engine.begin() as connection:
            assert connection.execute(sa.text("SELECT id FROM delivery")).scalars().all() == [1]
            connection.execute(
                sa.text(
                    "INSERT INTO delivery (campaign_id, subscription_id, push_service, status,"
                    " attempts, next_attempt_at, consent_reason, updated_at)"
                    " SELECT campaign_id, 'ff', push_service, 'queued', 0, next_attempt_at,"
                    " consent_reason, updated_at FROM delivery WHERE id = 1"
                )
            )
            assert connection.execute(sa.text("SELECT max(id) FROM delivery")).scalar() == 4
        downgrade(engine, "0031")
        upgrade(engine)
        with engine.connect() as connection:
            ids = connection.execute(sa.text("SELECT id FROM delivery ORDER BY id")).scalars()
            assert list(ids) == [1, 4]
    finally:
        engine.dispose()
