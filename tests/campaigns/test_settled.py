"""A finished campaign's counts kept once nothing can change them (portal/campaigns/settled.py):
the campaign list reads them instead of counting the campaign's deliveries at every view,
and shows the same figures as before; a campaign with a delivery still out is counted from
its rows until that delivery comes back. On SQLite and on PostgreSQL."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import sqlalchemy as sa
from flask import Flask

from portal.campaigns import services as campaigns
from portal.campaigns import settled, tally
from portal.campaigns.models import Campaign
from portal.db import db
from portal.delivery.models import Delivery
from portal.jobs import run_job
from portal.retention.tables import settle_campaigns
from tests.factories import FunnelFactory
from tests.helpers import sent_statements

S = dt.timedelta(seconds=1)
# A statement that reads the delivery table (or a partition of it on PostgreSQL).
READS_DELIVERY = re.compile(r"(?is).*\bFROM\s+delivery\b")
# A statement that counts deliveries.
COUNTS_DELIVERIES = re.compile(r"(?is).*\bcount\(.*\bFROM\s+delivery\b")


def _campaign(
    app: Flask,
    sent: dt.datetime,
    statuses: dict[str, int],
    *,
    status: str = "completed",
    title: str = "New sign-in",
) -> uuid.UUID:
    with db.begin(app) as session:
        factory = FunnelFactory(session, sent_at=sent)
        factory.campaign.status = status
        factory.campaign.title = title
        for delivery_status, n in statuses.items():
            for _ in range(n):
                factory.delivery(delivery_status, after=5 * S)
        return factory.campaign.id


def _kept(app: Flask, campaign_id: uuid.UUID) -> dict[str, int] | None:
    with db.begin(app) as session:
        campaign = session.get(Campaign, campaign_id)
        assert campaign is not None
        return campaign.settled_counts


def _listed(app: Flask) -> dict[uuid.UUID, dict[str, int]]:
    with db.begin(app) as session:
        page = campaigns.list_campaigns(session, include_tests=True)
        return {row.campaign.id: row.counts for row in page.rows}


def _set_status(app: Flask, campaign_id: uuid.UUID, old: str, new: str) -> None:
    with db.begin(app) as session:
        session.execute(
            sa.update(Delivery)
            .where(Delivery.campaign_id == campaign_id, Delivery.status == old)
            .values(status=new)
        )


def test_a_settled_campaign_is_listed_with_the_same_counts_and_its_rows_are_not_read(
    catalogue_ready, clock, campaigner, engine
):
    app = catalogue_ready
    now = clock.now()
    first = _campaign(app, now - 3600 * S, {"accepted": 4, "failed": 2, "revoked": 1})
    second = _campaign(app, now - 1800 * S, {"accepted": 3, "skipped": 2}, title="Second")
    before = _listed(app)
    page_before = campaigner.get("/staff/campaigns")
    assert page_before.status_code == 200

    assert settle_campaigns(app) == 2

    assert _kept(app, first) == {"accepted": 4, "failed": 2, "revoked": 1}
    assert _kept(app, second) == {"accepted": 3, "skipped": 2}
    with sent_statements(engine, READS_DELIVERY) as reads:
        assert _listed(app) == before
        page_after = campaigner.get("/staff/campaigns")
    assert reads == []
    assert page_after.status_code == 200
    assert page_after.text.count("Second") == page_before.text.count("Second")
    # The page says the same: its numbers and headlines (the form token aside).
    token = re.compile(r'name="csrf_token"[^>]*value="[^"]*"')
    assert token.sub("", page_after.text) == token.sub("", page_before.text)


def test_only_the_campaigns_not_settled_are_counted_from_their_rows(catalogue_ready, clock):
    app = catalogue_ready
    now = clock.now()
    done = _campaign(app, now - 3600 * S, {"accepted": 2})
    sending = _campaign(app, now - 60 * S, {"accepted": 1, "queued": 3}, status="sending")
    settle_campaigns(app)
    assert _kept(app, done) == {"accepted": 2}
    assert _kept(app, sending) is None  # not finished: still counted

    # The settled campaign's rows are no longer read: rows changed behind the app's
    # back (never done by the app) leave its listed counts as kept, while the campaign
    # still sending is counted from its rows.
    _set_status(app, done, "accepted", "failed")
    _set_status(app, sending, "queued", "accepted")
    listed = _listed(app)
    assert listed[done]["accepted"] == 2 and listed[done]["failed"] == 0
    assert (listed[sending]["accepted"], listed[sending]["queued"]) == (4, 0)


def test_a_cancelled_campaign_with_a_batch_out_is_settled_once_it_comes_back(
    catalogue_ready, clock
):
    app = catalogue_ready
    now = clock.now()
    campaign_id = _campaign(
        app, now - 60 * S, {"accepted": 2, "sending": 2, "skipped": 3}, status="cancelled"
    )
    run_job(app, "table-retention")
    assert _kept(app, campaign_id) is None  # two deliveries still out
    assert _listed(app)[campaign_id]["sending"] == 2

    _set_status(app, campaign_id, "sending", "accepted")  # the batch's answers
    run_job(app, "table-retention")

    assert _kept(app, campaign_id) == {"accepted": 4, "skipped": 3}
    assert _listed(app)[campaign_id]["accepted"] == 4


def test_counts_are_kept_once_and_never_counted_again(catalogue_ready, clock, engine):
    app = catalogue_ready
    campaign_id = _campaign(app, clock.now() - 60 * S, {"accepted": 2}, status="expired")
    assert settle_campaigns(app) == 1
    with sent_statements(engine, COUNTS_DELIVERIES) as counting:
        assert settle_campaigns(app) == 0
        with db.begin(app) as session:
            assert settled.settle(session, [campaign_id]) == []
    assert counting == []
    assert _kept(app, campaign_id) == {"accepted": 2}


def test_a_campaign_not_finished_is_never_settled(catalogue_ready, clock):
    app = catalogue_ready
    now = clock.now()
    ids = [
        _campaign(app, now - 60 * S, {"accepted": 2}, status=status)
        for status in ("scheduled", "sending", "paused")
    ]
    with db.begin(app) as session:
        assert settled.settle(session, ids) == []
    assert settle_campaigns(app) == 0
    assert [_kept(app, campaign_id) for campaign_id in ids] == [None, None, None]


def test_a_settled_campaign_s_counts_include_its_folded_deliveries(catalogue_ready, clock):
    # Settled after retention folded part of its rows into delivery_tally: the kept
    # counts are rows and counters together, as the list counted them.
    app = catalogue_ready
    campaign_id = _campaign(app, clock.now() - 60 * S, {"accepted": 3, "failed": 1})
    before = _listed(app)[campaign_id]
    with db.begin(app) as session:
        ids = list(
            session.execute(
                sa.select(Delivery.id)
                .where(Delivery.campaign_id == campaign_id)
                .order_by(Delivery.id)
                .limit(2)
            ).scalars()
        )
        assert tally.fold(session, campaign_id, ids) == 2
    settle_campaigns(app)
    assert _kept(app, campaign_id) == {"accepted": 3, "failed": 1}
    assert _listed(app)[campaign_id] == before
