"""An idle process's tick costs one cheap query (SPEC §7: per-process polling cost).

Every process of a deployment ticks the dispatch job; while no campaign is sending (or
due to start, or paused past its end, or ended with deliveries still to mark skipped) a
tick asks the database one question on the small ``campaign`` table and stops there. The gauges are refreshed at most once a minute
meanwhile.
"""

from __future__ import annotations

import re

from portal.campaigns.models import Campaign
from portal.db import db
from tests.delivery.test_engine import _launch, _subscribe
from tests.helpers import sent_statements


def test_an_idle_tick_is_one_query(push_app, dispatcher):
    engine = push_app.extensions["portal.db"].engine
    dispatcher.tick()  # the first refreshes the gauges too
    with sent_statements(engine) as seen:
        report = dispatcher.tick()
    assert report.claimed == 0
    assert len(seen) == 1, seen
    ((statement, _),) = seen
    # It reads the campaign table; the delivery table only for a campaign that ended with
    # deliveries still to mark skipped and its counts not kept (portal/campaigns/unsent.py):
    # none here, and a handful at most, the ones ended lately.
    assert re.search(r"\bFROM campaign\b", statement), statement
    assert "delivery" not in statement.split("settled_counts IS NULL", 1)[0], statement


def test_a_due_campaign_still_starts_and_finishes_after_idle_ticks(
    push_app, dispatcher, fake_push, clock
):
    engine = push_app.extensions["portal.db"].engine
    dispatcher.tick()
    dispatcher.tick()
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    campaign_id = _launch(push_app, clock)
    report = dispatcher.tick()
    assert report.accepted == 1
    assert len(fake_push.received(sub)) == 1
    with db.begin(push_app) as session:
        assert session.get(Campaign, campaign_id).status == "completed"
    with sent_statements(engine) as seen:
        dispatcher.tick()
    assert len(seen) == 1  # idle again once it completed
