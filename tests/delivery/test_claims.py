"""The claim reads only the rows still to send (``ix_delivery_due``, migrations 0017,
0026 and 0033: each campaign's due rows by due time).

Its cost must not grow with what was already sent, in this campaign or earlier ones
(SPEC §7; the figures are ``bench/claims.py``'s). Here: the plan both databases choose for
the engine's own claim statement names the partial index, on a table where most rows are
answered; and what the index leaves out is never what a claim must take (retries once
due, batches whose lease ran out).
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from portal.campaigns import services as campaigns
from portal.campaigns.models import Campaign
from portal.campaigns.services import CampaignDraft
from portal.db import db
from portal.delivery import partitions
from portal.delivery.engine import Dispatcher
from portal.delivery.models import Delivery
from tests.helpers import sent_statements

_d = Delivery.__table__


def _campaign(app, clock, status: str) -> uuid.UUID:
    with db.begin(app) as session:
        draft = CampaignDraft(topic="weekly-digest", title="Monday digest", body="Five things")
        campaign = campaigns.create_campaign(session, draft, created_by="test", now=clock.now())
        campaign.status = status
        campaign.materialised_at = clock.now()
        return campaign.id


def _rows(campaign_id: uuid.UUID, count: int, now: dt.datetime, **values: Any) -> list[dict]:
    base = {
        "campaign_id": campaign_id,
        "push_service": "fcm",
        "status": "queued",
        "attempts": 0,
        "next_attempt_at": now - dt.timedelta(minutes=1),
        "lease_expires_at": None,
        "consent_reason": "explicit_opt_in",
        "updated_at": now,
    }
    return [base | values | {"subscription_id": uuid.uuid4()} for _ in range(count)]


def _insert(app, rows: list[dict]) -> list[int]:
    with db.begin(app) as session:
        return list(session.execute(sa.insert(_d).returning(_d.c.id), rows).scalars())


# PostgreSQL: WITH picked AS MATERIALIZED (...) UPDATE delivery ...
_CLAIM_UPDATE = re.compile(r"\s*(WITH\b.*\))?\s*UPDATE DELIVERY", re.I | re.S)


def _claim_statements(
    app, dispatcher: Dispatcher, pattern: re.Pattern[str] = _CLAIM_UPDATE
) -> tuple[list[tuple[str, Any]], list[int]]:
    """Run the engine's claim; return the statements it sent that match ``pattern``
    (its UPDATEs by default), with their parameters, and the ids it claimed."""
    with sent_statements(app.extensions["portal.db"].engine, pattern) as seen:
        claimed = dispatcher.claim()
    return seen, [c.delivery_id for c in claimed]


def _captured_claim(app, dispatcher: Dispatcher) -> tuple[str, Any, list[int]]:
    """Run the engine's claim of one statement; return it, its parameters and the ids."""
    ((statement, parameters),), claimed = _claim_statements(app, dispatcher)
    return statement, parameters, claimed


def _plan(app, backend: str, statement: str, parameters: Any) -> str:
    engine = app.extensions["portal.db"].engine
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        if backend == "postgresql":
            cursor.execute("EXPLAIN " + statement, parameters)  # planned, not run
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + statement, parameters)
        lines = [" ".join(str(part) for part in row) for row in cursor.fetchall()]
        raw.rollback()
    finally:
        raw.close()
    return "\n".join(lines)


def _rows_read(app, statement: str, parameters: Any) -> int:
    """PostgreSQL: how many ``delivery`` index entries and rows the claim's choice read
    (EXPLAIN ANALYZE, rolled back), the UPDATE's own look-up by primary key left out."""
    read = 0

    def walk(node: dict) -> None:
        nonlocal read
        # delivery or one of its partitions (migration 0031), by the table or the due
        # rows' index, whose partitions' copies are named after the partition.
        index = str(node.get("Index Name", ""))
        table = str(node.get("Relation Name", ""))
        if not (index == "pk_delivery" or index.endswith("_pkey")) and (
            table == "delivery"
            or partitions.is_partition(table)
            or index.startswith(("ix_delivery", "delivery_"))
        ):
            loops = node.get("Actual Loops", 1)
            read += (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops
        for child in node.get("Plans", []):
            walk(child)

    walk(_analysed_plan(app, statement, parameters))
    return read


def _analysed_plan(app, statement: str, parameters: Any) -> dict:
    """PostgreSQL: the statement's plan as run (EXPLAIN ANALYZE, JSON), rolled back."""
    raw = app.extensions["portal.db"].engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
        ((document,),) = cursor.fetchall()
        raw.rollback()
    finally:
        raw.close()
    return document[0]["Plan"]


def test_the_claim_reads_the_due_rows_index(push_app, dispatcher, clock, backend):
    now = clock.now()
    finished = _campaign(push_app, clock, "completed")
    sending = _campaign(push_app, clock, "sending")
    # Most of the table answered: an earlier campaign and most of this one.
    _insert(push_app, _rows(finished, 6000, now, status="accepted", attempts=1))
    _insert(push_app, _rows(sending, 6000, now, status="accepted", attempts=1))
    due = _insert(push_app, _rows(sending, 120, now))
    with db.begin(push_app) as session:
        session.execute(sa.text("ANALYZE delivery" if backend == "postgresql" else "ANALYZE"))

    statement, parameters, claimed = _captured_claim(push_app, dispatcher)
    assert claimed == due[: dispatcher.settings.batch_size]  # lowest ids first, as before

    if backend == "postgresql":
        # Whichever index the planner takes at this size (the due rows by time, or the
        # campaign's queued rows by time), it reads none of the 12,000 answered rows: its
        # nodes that read delivery see a few hundred entries together (the due rows, the
        # batch the claim above took, the versions its update left).
        assert _rows_read(push_app, statement, parameters) <= 6 * len(due)
    else:
        plan = _plan(push_app, backend, statement, parameters)
        assert "ix_delivery_due" in plan, plan


def test_the_claim_reads_only_the_rows_already_due(push_app, dispatcher, clock, backend):
    """A local-time campaign: most deliveries wait for a later hour, with the lowest ids.
    The claim takes the due ones, and its plan bounds the index scan by the campaign and
    the due time instead of reading past every row that waits (migrations 0026, 0033)."""
    now = clock.now()
    sending = _campaign(push_app, clock, "sending")
    _insert(push_app, _rows(sending, 6000, now, next_attempt_at=now + dt.timedelta(hours=5)))
    due = _insert(push_app, _rows(sending, 120, now))
    with db.begin(push_app) as session:
        session.execute(sa.text("ANALYZE delivery" if backend == "postgresql" else "ANALYZE"))

    statement, parameters, claimed = _captured_claim(push_app, dispatcher)
    assert claimed == due[: dispatcher.settings.batch_size]

    if backend == "postgresql":  # not the 6,000 that wait (a few hundred: see above)
        assert _rows_read(push_app, statement, parameters) <= 6 * len(due)
    else:
        plan = _plan(push_app, backend, statement, parameters)
        assert "USING INDEX ix_delivery_due (campaign_id=? AND next_attempt_at<?)" in plan, plan


def test_the_index_holds_only_the_rows_still_to_send(engine, backend, push_app):
    with engine.connect() as conn:
        if backend == "postgresql":
            definition = conn.execute(
                sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_delivery_due'")
            ).scalar_one()
        else:
            definition = conn.execute(
                sa.text("SELECT sql FROM sqlite_master WHERE name = 'ix_delivery_due'")
            ).scalar_one()
    assert "WHERE" in definition and "queued" in definition and "sending" in definition


def test_retries_and_expired_leases_are_still_claimed(push_app, dispatcher, clock):
    now = clock.now()
    sending = _campaign(push_app, clock, "sending")
    _insert(push_app, _rows(sending, 30, now, status="accepted", attempts=1))
    (retry,) = _insert(
        push_app, _rows(sending, 1, now, attempts=1, next_attempt_at=now + dt.timedelta(seconds=30))
    )
    (expired,) = _insert(
        push_app,
        _rows(sending, 1, now, status="sending", attempts=1, lease_expires_at=now),
    )
    (live,) = _insert(
        push_app,
        _rows(
            sending,
            1,
            now,
            status="sending",
            attempts=1,
            lease_expires_at=now + dt.timedelta(seconds=60),
        ),
    )

    clock.advance(seconds=1)
    # The batch whose sender died is taken again; the retry is not due yet; the batch
    # whose lease runs is someone else's.
    assert [c.delivery_id for c in dispatcher.claim()] == [expired]
    clock.advance(seconds=30)
    assert [c.delivery_id for c in dispatcher.claim()] == [retry]
    assert dispatcher.claim() == []
    clock.advance(seconds=30)
    (claimed,) = dispatcher.claim()
    assert (claimed.delivery_id, claimed.attempts) == (live, 2)
    # Claimed again: out again under a fresh lease, in the index until answered.
    clock.advance(seconds=dispatcher.settings.lease_seconds + 1)
    assert {c.delivery_id for c in dispatcher.claim()} == {expired, retry, live}


@pytest.mark.parametrize("status", ["paused", "completed"])
def test_no_claim_from_a_campaign_that_is_not_sending(push_app, dispatcher, clock, status):
    now = clock.now()
    other = _campaign(push_app, clock, status)
    _insert(push_app, _rows(other, 5, now))
    assert dispatcher.claim() == []


@pytest.mark.postgres_only
def test_a_claim_reads_a_batch_not_the_campaign_when_the_statistics_predate_it(
    push_app, dispatcher, clock
):
    """A campaign whose rows came after the table's statistics were taken (a new campaign
    in a busy month: autovacuum analyses after a tenth of the table changed): the planner
    believes the campaign has no rows. The claim's update then found each chosen row
    through the campaign's index, reading the whole campaign once per row: 1.9 s a claim
    at 45,000 rows in bench/dispatch.py. It finds them by their place (tableoid, ctid),
    whatever the statistics say."""
    now = clock.now()
    finished = _campaign(push_app, clock, "completed")
    _insert(push_app, _rows(finished, 3000, now, status="accepted", attempts=1))
    with db.begin(push_app) as session:
        session.execute(sa.text("ANALYZE delivery"))
    sending = _campaign(push_app, clock, "sending")
    due = _insert(push_app, _rows(sending, 3000, now))

    statement, parameters, claimed = _captured_claim(push_app, dispatcher)
    assert claimed == due[: dispatcher.settings.batch_size]
    # Every row any node of the plan handled, counted once per loop: the due rows a few
    # times at most (the choice may read them all, believing them few), not the campaign
    # once for each row of the batch (that plan handled 300,000 here).
    assert _rows_handled(push_app, statement, parameters) <= 3 * len(due)


def _rows_handled(app, statement: str, parameters: Any) -> int:
    """PostgreSQL: the rows every node of the claim's plan produced or filtered out, times
    its loops (EXPLAIN ANALYZE, rolled back)."""

    def handled(node: dict) -> int:
        rows = sum(
            node.get(key, 0)
            for key in ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Join Filter")
        )
        return rows * node.get("Actual Loops", 1) + sum(map(handled, node.get("Plans", [])))

    return handled(_analysed_plan(app, statement, parameters))


@pytest.mark.postgres_only
@pytest.mark.parametrize("analysed", [True, False], ids=["analysed", "statistics-predate-it"])
def test_a_paused_campaign_s_queue_is_not_read_by_every_claim(
    push_app, dispatcher, clock, analysed
):
    """A large campaign paused with its deliveries due (earlier than another's, with lower
    ids) while another campaign sends: each claim of the sending one must read its own
    batch, not walk the paused queue first. Walking the due rows in time order and
    dropping the paused ones read all of them for every batch of every other campaign."""
    now = clock.now()
    paused = _campaign(push_app, clock, "paused")
    _insert(push_app, _rows(paused, 6000, now, next_attempt_at=now - dt.timedelta(hours=1)))
    if analysed:
        with db.begin(push_app) as session:
            session.execute(sa.text("ANALYZE delivery"))
    sending = _campaign(push_app, clock, "sending")
    due = _insert(push_app, _rows(sending, 800, now))
    if analysed:
        with db.begin(push_app) as session:
            session.execute(sa.text("ANALYZE delivery"))

    statement, parameters, claimed = _captured_claim(push_app, dispatcher)
    assert claimed == due[: dispatcher.settings.batch_size]
    # The batch and a few times more, not the 6,000 paused rows.
    assert _rows_handled(push_app, statement, parameters) <= 3 * len(due)


def test_a_claim_takes_the_campaigns_in_the_order_they_were_to_start(push_app, dispatcher, clock):
    """Each sending campaign's due deliveries are read from its own part of the index,
    the campaigns in the order of their send times, until the batch is full; a paused
    campaign is passed by."""
    now = clock.now()
    later = _campaign(push_app, clock, "sending")
    earlier = _campaign(push_app, clock, "sending")  # made after, to start before
    paused = _campaign(push_app, clock, "paused")
    with db.begin(push_app) as session:
        for campaign_id, minutes in ((later, 1), (earlier, 2), (paused, 3)):
            session.execute(
                sa.update(Campaign)
                .where(Campaign.id == campaign_id)
                .values(send_at=now - dt.timedelta(minutes=minutes))
            )
    size = dispatcher.settings.batch_size
    later_rows = _insert(
        push_app, _rows(later, size, now, next_attempt_at=now - dt.timedelta(minutes=1))
    )
    earlier_rows = _insert(
        push_app, _rows(earlier, size // 2, now, next_attempt_at=now - dt.timedelta(minutes=2))
    )
    _insert(push_app, _rows(paused, size, now, next_attempt_at=now - dt.timedelta(minutes=3)))

    first = [c.delivery_id for c in dispatcher.claim()]
    assert first == sorted(earlier_rows + later_rows[: size - size // 2])
    second = [c.delivery_id for c in dispatcher.claim()]
    assert second == later_rows[size - size // 2 :]
    assert dispatcher.claim() == []


def test_a_claim_serves_more_sending_campaigns_than_one_select_may_join(
    push_app, dispatcher, clock
):
    """SQLite joins at most 500 selects in one compound select: a claim written as one
    select per sending campaign failed outright with 501 campaigns sending."""
    now = clock.now()
    rows = []
    for _ in range(501):
        rows += _rows(_campaign(push_app, clock, "sending"), 1, now)
    due = _insert(push_app, rows)
    assert [c.delivery_id for c in dispatcher.claim()] == due[: dispatcher.settings.batch_size]


@pytest.mark.postgres_only
def test_a_claim_locks_only_the_deliveries_it_takes(push_app, dispatcher, clock):
    """While one process's claim is still open, another finds the rest: a claim that
    locked a batch of every sending campaign (taking one batch of them) left a second
    claimer nothing with 100 deliveries free."""
    size = dispatcher.settings.batch_size
    now = clock.now()
    for n in range(3):
        campaign = _campaign(push_app, clock, "sending")
        _insert(push_app, _rows(campaign, size, now, next_attempt_at=now - dt.timedelta(seconds=n)))
    with db.begin(push_app) as session:
        session.execute(sa.text("ANALYZE delivery"))
    statement, parameters, first = _captured_claim(push_app, dispatcher)
    with db.begin(push_app) as session:  # as they were: queued, due
        session.execute(sa.text("UPDATE delivery SET status = 'queued', attempts = 0"))
    raw = push_app.extensions["portal.db"].engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute(statement, parameters)  # the first claim, not committed yet
        taken = {row[0] for row in cursor.fetchall()}
        meanwhile = {c.delivery_id for c in dispatcher.claim()}
        raw.rollback()
    finally:
        raw.close()
    assert taken == set(first) and len(taken) == size
    assert len(meanwhile) == size and not meanwhile & taken


@pytest.mark.postgres_only
def test_claims_beside_many_campaigns_newer_than_the_statistics_read_a_batch(
    push_app, dispatcher, clock
):
    """Twenty sending campaigns whose rows came after the statistics: a claim joining
    them in one statement was planned as if each had one row and read every campaign
    once per row (25 million rows handled, 1.9 s a claim with fifty)."""
    size = dispatcher.settings.batch_size
    now = clock.now()
    finished = _campaign(push_app, clock, "completed")
    _insert(push_app, _rows(finished, 3000, now, status="accepted", attempts=1))
    with db.begin(push_app) as session:
        session.execute(sa.text("ANALYZE delivery"))
    for n in range(20):
        campaign = _campaign(push_app, clock, "sending")
        _insert(push_app, _rows(campaign, 200, now, next_attempt_at=now - dt.timedelta(seconds=n)))

    reading = re.compile(r"\s*(WITH\b|SELECT\b|UPDATE\b).*\bdelivery\b", re.I | re.S)
    seen, claimed = _claim_statements(push_app, dispatcher, reading)
    assert len(claimed) == size
    with db.begin(push_app) as session:  # as they were, for the plans below
        session.execute(
            sa.text("UPDATE delivery SET status = 'queued', attempts = 0 WHERE status = 'sending'")
        )
    handled = sum(_rows_handled(push_app, statement, parameters) for statement, parameters in seen)
    # The batch a few times over, and an entry or two of each campaign it asked.
    assert handled <= 5 * size + 20 * 10
