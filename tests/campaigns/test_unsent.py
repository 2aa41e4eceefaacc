"""What a cancelled or expired campaign left queued (portal/campaigns/unsent.py).

A cancel changes the campaign's row alone, however large its queue: the pages count what
it left queued as skipped at once, nothing of it is sent, and the dispatcher marks the
rows skipped a chunk at a time, after which the figures are the same and the campaign's
counts are kept.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from collections import Counter
from dataclasses import replace

import pytest
import sqlalchemy as sa

from portal.campaigns import outcome, services, settled, unsent
from portal.campaigns.models import Campaign
from portal.compliance import services as compliance
from portal.db import db
from portal.delivery.models import Delivery
from portal.subscriptions.models import PushSubscription
from tests.campaigns.test_controls_under_concurrency import counts as rows
from tests.campaigns.test_pages import make_campaign
from tests.delivery.test_engine import _subscribe
from tests.helpers import sent_statements
from tests.plans import PLANNED, deliveries, plans, populate, whole_table_reads

AUDIENCE = 7


def figures(app, campaign_id, now):
    """Everything the pages show of the campaign's deliveries."""
    with db.begin(app) as session:
        campaign = session.get(Campaign, campaign_id)
        reading = outcome.read(session, campaign, now=now)
        said = outcome.headline(reading.facts)
        return {
            "counts": {k: v for k, v in reading.facts.counts.items() if v},
            "reasons": [(r.status, r.reason, r.count) for r in reading.facts.reasons],
            "headline": said.text,
            "by_service": services.outcome_by_service(session, campaign),
            "list": {
                k: v for k, v in settled.counts(session, [campaign])[campaign_id].items() if v
            },
            "history": sorted(
                row.status
                for (subscriber_id,) in session.execute(sa.select(PushSubscription.subscriber_id))
                for row in compliance.history(session, subscriber_id, actor=None).deliveries
            ),
        }


@pytest.fixture
def queued_campaign(push_app, dispatcher, clock, fake_push):
    """A sending campaign whose whole audience is materialised and queued."""
    for _ in range(AUDIENCE):
        _subscribe(push_app, fake_push, topics=["weekly-digest"])
    campaign_id = make_campaign(push_app, clock)
    dispatcher.advance_campaigns()
    assert rows(push_app, campaign_id) == Counter({("queued", None): AUDIENCE})
    return campaign_id


@pytest.mark.pgbouncer
def test_a_cancel_writes_the_campaign_row_alone_and_the_pages_say_skipped_at_once(
    push_app, dispatcher, queued_campaign, clock, fake_push
):
    engine = push_app.extensions["portal.db"].engine
    with sent_statements(engine) as seen, db.begin(push_app) as session:
        services.control(session, queued_campaign, "cancel", now=clock.now())
    writes = [s for s, _ in seen if not s.lstrip().upper().startswith("SELECT")]
    assert writes and all("delivery" not in s for s in writes), writes
    assert rows(push_app, queued_campaign) == Counter({("queued", None): AUDIENCE})

    before = figures(push_app, queued_campaign, clock.now())
    assert before["counts"] == {"skipped": AUDIENCE}
    assert before["reasons"] == [("skipped", "cancelled", AUDIENCE)]
    assert before["headline"] == f"Cancelled: 0 of {AUDIENCE} delivered, {AUDIENCE} skipped."
    assert before["list"] == {"skipped": AUDIENCE}
    assert [(answer, n) for _, answer, n in before["by_service"]] == [
        ("skipped:cancelled", AUDIENCE)
    ]
    assert before["history"] == ["skipped"] * AUDIENCE

    report = dispatcher.tick()  # sends nothing: the campaign is cancelled
    assert report.claimed == 0 and report.skipped == AUDIENCE
    assert fake_push.received() == []
    assert rows(push_app, queued_campaign) == Counter({("skipped", "cancelled"): AUDIENCE})
    assert figures(push_app, queued_campaign, clock.now()) == before
    with db.begin(push_app) as session:
        kept = session.get(Campaign, queued_campaign).settled_counts
    assert kept == {"skipped": AUDIENCE}

    with sent_statements(engine) as seen:
        dispatcher.tick()
    assert len(seen) == 1, seen  # idle again


def test_an_expired_campaign_is_marked_the_same_way(
    push_app, dispatcher, queued_campaign, clock, fake_push
):
    with db.begin(push_app) as session:
        session.execute(
            sa.update(Campaign)
            .where(Campaign.id == queued_campaign)
            .values(deliver_until=clock.now() - dt.timedelta(seconds=1))
        )
    dispatcher.advance_campaigns()  # expires it: the campaign row alone
    assert rows(push_app, queued_campaign) == Counter({("queued", None): AUDIENCE})
    before = figures(push_app, queued_campaign, clock.now())
    assert before["reasons"] == [("skipped", "deliver_until_passed", AUDIENCE)]
    assert before["headline"].startswith("Expired before the end: 0 of 7 delivered, 7 skipped")
    dispatcher.tick()
    assert fake_push.received() == []
    assert rows(push_app, queued_campaign) == Counter(
        {("skipped", "deliver_until_passed"): AUDIENCE}
    )
    assert figures(push_app, queued_campaign, clock.now()) == before


def test_marking_goes_a_chunk_a_transaction_within_the_ticks_time(
    push_app, dispatcher, queued_campaign, clock
):
    with db.begin(push_app) as session:
        services.control(session, queued_campaign, "cancel", now=clock.now())
    dispatcher.settings = replace(dispatcher.settings, unsent_chunk=2, unsent_seconds=0.0)
    assert dispatcher.skip_unsent() == 0  # no time for it this tick
    dispatcher.settings = replace(dispatcher.settings, unsent_seconds=60.0)
    engine = push_app.extensions["portal.db"].engine
    with sent_statements(engine) as seen:
        assert dispatcher.skip_unsent() == AUDIENCE
    chunks = [s for s, _ in seen if "UPDATE delivery" in s and "RETURNING" in s]
    # 2 + 2 + 2 + 1, then one from the start finds nothing left and the campaign is done.
    assert len(chunks) == 5
    assert rows(push_app, queued_campaign) == Counter({("skipped", "cancelled"): AUDIENCE})


def test_a_row_queued_behind_the_last_chunk_is_found_before_the_campaign_is_done(
    push_app, dispatcher, queued_campaign, clock
):
    with db.begin(push_app) as session:
        services.control(session, queued_campaign, "cancel", now=clock.now())
        first = session.scalars(
            sa.select(Delivery.id)
            .where(Delivery.campaign_id == queued_campaign)
            .order_by(Delivery.next_attempt_at, Delivery.id)
        ).first()
    dispatcher.settings = replace(dispatcher.settings, unsent_chunk=AUDIENCE)
    with db.begin(push_app) as session:
        (reason,) = [r for c, r in unsent.to_skip(session, clock.now()) if c == queued_campaign]
        marked, last = unsent.skip_chunk(
            session, queued_campaign, reason, now=clock.now(), after=None, limit=AUDIENCE
        )
        assert marked == AUDIENCE
        # An answer put the first back in the queue, due before the place marked to.
        session.execute(
            sa.update(Delivery)
            .where(Delivery.id == first)
            .values(status="queued", reason=None, next_attempt_at=clock.now() - dt.timedelta(1))
        )
    dispatcher._unsent_after[queued_campaign] = last
    assert dispatcher.skip_unsent() == 1
    assert rows(push_app, queued_campaign) == Counter({("skipped", "cancelled"): AUDIENCE})


def test_a_delivery_out_when_the_campaign_is_cancelled_keeps_its_answer(
    push_app, dispatcher, queued_campaign, clock
):
    with db.begin(push_app) as session:
        out = session.scalars(
            sa.select(Delivery.id).where(Delivery.campaign_id == queued_campaign).limit(1)
        ).one()
        session.execute(
            sa.update(Delivery)
            .where(Delivery.id == out)
            .values(status="sending", lease_expires_at=clock.now() + dt.timedelta(minutes=1))
        )
        services.control(session, queued_campaign, "cancel", now=clock.now())
    assert dispatcher.skip_unsent() == AUDIENCE - 1
    assert rows(push_app, queued_campaign) == Counter(
        {("skipped", "cancelled"): AUDIENCE - 1, ("sending", None): 1}
    )
    with db.begin(push_app) as session:
        # Still out: its counts are not kept until its answer is in.
        assert session.get(Campaign, queued_campaign).settled_counts is None
    assert (
        "1 still with a push service" in figures(push_app, queued_campaign, clock.now())["headline"]
    )


def test_a_delivery_whose_sender_stopped_after_the_cancel_ends_with_no_answer_recorded(
    push_app, dispatcher, queued_campaign, clock
):
    """Out when the campaign was cancelled, its sender stopped (the lease it renews ran
    out): no answer will come, and nothing sends it again. It ends as failed with no
    answer recorded, and the campaign's counts are kept, instead of "1 still with a push
    service" for good."""
    with db.begin(push_app) as session:
        out, alive = session.scalars(
            sa.select(Delivery.id).where(Delivery.campaign_id == queued_campaign).limit(2)
        ).all()
        for delivery_id, lease in ((out, -1), (alive, 60)):
            session.execute(
                sa.update(Delivery)
                .where(Delivery.id == delivery_id)
                .values(
                    status="sending",
                    attempts=1,
                    lease_expires_at=clock.now() + dt.timedelta(seconds=lease),
                )
            )
        services.control(session, queued_campaign, "cancel", now=clock.now())
    assert dispatcher.skip_unsent() == AUDIENCE - 2
    assert rows(push_app, queued_campaign) == Counter(
        {
            ("skipped", "cancelled"): AUDIENCE - 2,
            ("failed", unsent.NO_ANSWER): 1,
            ("sending", None): 1,  # its sender is alive: its answer is still to come
        }
    )
    clock.advance(dt.timedelta(seconds=61))  # that sender stopped too
    assert dispatcher.tick().claimed == 0
    assert rows(push_app, queued_campaign) == Counter(
        {("skipped", "cancelled"): AUDIENCE - 2, ("failed", unsent.NO_ANSWER): 2}
    )
    said = figures(push_app, queued_campaign, clock.now())
    assert said["headline"] == f"Cancelled: 0 of {AUDIENCE} delivered, 2 failed, 5 skipped."
    assert ("failed", unsent.NO_ANSWER, 2) in said["reasons"]
    with db.begin(push_app) as session:
        assert session.get(Campaign, queued_campaign).settled_counts == {
            "failed": 2,
            "skipped": AUDIENCE - 2,
        }
        reading = outcome.read(session, session.get(Campaign, queued_campaign), now=clock.now())
    assert outcome.breakdown(reading.facts.reasons)[-1] == (
        "No answer recorded: the campaign ended while it was out, and the process sending "
        "it stopped before writing the push service's answer (it may have arrived)",
        2,
    )


def test_only_ended_campaigns_are_counted_so(push_app, queued_campaign, clock):
    for status in ("sending", "paused", "scheduled", "completed"):
        assert unsent.as_shown(status, "queued", None) == ("queued", None)
        assert unsent.shown_counts(status, {"queued": 3}) == {"queued": 3}
    assert unsent.as_shown("cancelled", "accepted", None) == ("accepted", None)
    assert unsent.as_shown("cancelled", "sending", None) == ("sending", None)
    assert unsent.shown_counts("expired", {"queued": 3, "skipped": 1, "accepted": 2}) == {
        "queued": 0,
        "skipped": 4,
        "accepted": 2,
    }
    # The paused campaign's page still says queued.
    with db.begin(push_app) as session:
        services.control(session, queued_campaign, "pause", now=clock.now())
    assert figures(push_app, queued_campaign, clock.now())["counts"] == {"queued": AUDIENCE}


@pytest.mark.postgres_only
def test_each_chunk_reads_the_due_index_from_where_the_last_ended(push_app, queued_campaign, clock):
    """On PostgreSQL a chunk reads ix_delivery_due from its place on: the rows marked
    before it stay in the index until vacuumed, and are not walked again. (With a queue of
    a few rows the planner may as well take ix_delivery_claim and sort them: the queue
    here is 50,000, all due at the same moment, as a materialised audience is.)"""
    engine = push_app.extensions["portal.db"].engine
    with db.begin(push_app) as session:
        person = session.scalars(sa.select(PushSubscription.subscriber_id).limit(1)).one()
    populate(engine, person)  # thousands of people more
    deliveries(engine, at=clock.now())  # sent campaigns kept, in every partition
    with engine.begin() as conn:  # a queue of 50,000, as a large audience has
        conn.execute(
            sa.text(
                "INSERT INTO delivery (campaign_id, subscription_id, push_service, status, "
                "attempts, next_attempt_at, consent_reason, updated_at) "
                "SELECT :campaign, gen_random_uuid(), 'fcm', 'queued', 0, :at, "
                "'explicit_opt_in', :at FROM generate_series(1, 50000)"
            ),
            {"campaign": queued_campaign, "at": clock.now()},
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE delivery"))
    with db.begin(push_app) as session:
        services.control(session, queued_campaign, "cancel", now=clock.now())
    with sent_statements(engine, PLANNED) as seen, db.begin(push_app) as session:
        _, last = unsent.skip_chunk(
            session, queued_campaign, "cancelled", now=clock.now(), after=None, limit=500
        )
        unsent.skip_chunk(
            session, queued_campaign, "cancelled", now=clock.now(), after=last, limit=500
        )
    chunks = [(s, p) for s, p in seen if s.lstrip().startswith("WITH picked")]
    assert len(chunks) == 2, seen
    assert whole_table_reads(engine, chunks) == []
    (plan,) = plans(engine, chunks[1:])
    with engine.connect() as conn:
        # ix_delivery_due as each partition of delivery holds it.
        due = (
            conn.execute(
                sa.text(
                    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                    "WHERE i.inhparent = CAST('ix_delivery_due' AS regclass)"
                )
            )
            .scalars()
            .all()
        )
        used = re.findall(r"Index Scan using (\w+) on delivery_", plan)
    assert used and set(used) <= set(due), plan
    assert re.search(r"Index Cond: .*ROW\(next_attempt_at, id\) > ROW\(", plan), plan


def test_marking_against_answers_retries_and_stopped_senders_in_any_order(
    push_app, dispatcher, clock, fake_push
):
    """A state machine: an ended campaign's deliveries (queued now or later, out with a
    live sender or one that stopped, answered) while the dispatcher marks in chunks of any
    size, a tick's time running out at any point, answers arriving (a retry puts one back
    in the queue, behind the place marked to) and senders stopping. Always: every page
    count is the count the campaign ends with for each delivery no longer out; a row
    marked is a row that was queued, or out with its sender stopped; once the marking has
    run to its end, nothing is queued, nothing is out but what live senders hold, and the
    campaign's kept counts are its rows'."""
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import (
        RuleBasedStateMachine,
        invariant,
        rule,
        run_state_machine_as_test,
    )

    for _ in range(3):
        _subscribe(push_app, fake_push, topics=["weekly-digest"])
    now0 = clock.now()

    class Marking(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            with db.begin(push_app) as session:
                session.execute(sa.delete(Delivery))
                session.execute(sa.delete(Campaign))
            clock.set(now0)
            self.campaign = make_campaign(push_app, clock)
            with db.begin(push_app) as session:
                session.execute(
                    sa.update(Campaign)
                    .where(Campaign.id == self.campaign)
                    .values(status="sending", materialised_at=now0)
                )
            self.made = 0
            dispatcher._unsent_after.clear()

        def _add(self, status, *, due=0, lease=None):
            self.made += 1
            with db.begin(push_app) as session:
                session.add(
                    Delivery(
                        campaign_id=self.campaign,
                        subscription_id=uuid.uuid4(),
                        push_service="fcm",
                        status=status,
                        attempts=0 if status == "queued" else 1,
                        next_attempt_at=clock.now() + dt.timedelta(seconds=due),
                        lease_expires_at=(
                            None if lease is None else clock.now() + dt.timedelta(seconds=lease)
                        ),
                        consent_reason="explicit_opt_in",
                        updated_at=clock.now(),
                    )
                )

        def _sending(self) -> bool:
            with db.begin(push_app) as session:
                return session.get(Campaign, self.campaign).status == "sending"

        # Deliveries are written (materialised) and claimed only while the campaign
        # sends: once it ended, nothing adds a delivery or takes one out.
        @rule(n=st.integers(1, 6), due=st.integers(-60, 60))
        def queued(self, n, due):
            if self._sending():
                for _ in range(n):
                    self._add("queued", due=due)

        @rule(lease=st.integers(-30, 60))
        def out(self, lease):
            if self._sending():
                self._add("sending", lease=lease)

        @rule()
        def cancel(self):
            with db.begin(push_app) as session:
                status = session.get(Campaign, self.campaign).status
                if status == "sending":
                    services.control(session, self.campaign, "cancel", now=clock.now())

        @rule(retry=st.booleans())
        def an_answer(self, retry):
            """A live sender writes its answer: accepted, or (the campaign still sending)
            back in the queue for a retry, due before anything else."""
            with db.begin(push_app) as session:
                campaign = session.get(Campaign, self.campaign)
                row = session.scalars(
                    sa.select(Delivery)
                    .where(Delivery.status == "sending", Delivery.lease_expires_at > clock.now())
                    .limit(1)
                ).first()
                if row is None:
                    return
                if retry and campaign.status == "sending":
                    row.status, row.reason = "queued", "server_error"
                    row.next_attempt_at = now0 - dt.timedelta(hours=1)
                elif retry:
                    row.status, row.reason = "skipped", unsent.ENDED_REASONS[campaign.status]
                else:
                    row.status, row.last_status_code = "accepted", 201
                row.lease_expires_at = None

        @rule(seconds=st.integers(1, 90))
        def time_passes(self, seconds):
            clock.advance(dt.timedelta(seconds=seconds))

        @rule(chunk=st.integers(1, 4), budget=st.sampled_from([0.0, 60.0]))
        def a_tick(self, chunk, budget):
            dispatcher.settings = replace(
                dispatcher.settings, unsent_chunk=chunk, unsent_seconds=budget
            )
            before = self._rows()
            dispatcher.skip_unsent()
            for delivery_id, (status, reason, _) in self._rows().items():
                was = before[delivery_id]
                if (status, reason) != was[:2]:
                    assert was[0] == "queued" or (
                        was[0] == "sending" and was[2] is not None and was[2] < clock.now()
                    ), (was, status, reason)

        def _rows(self):
            with db.begin(push_app) as session:
                return {
                    d.id: (d.status, d.reason, d.lease_expires_at)
                    for d in session.scalars(sa.select(Delivery))
                }

        @invariant()
        def the_pages_count_what_will_stay(self):
            with db.begin(push_app) as session:
                campaign = session.get(Campaign, self.campaign)
                status_now = campaign.status
                shown = outcome.read(session, campaign, now=clock.now()).facts.counts
            rows = self._rows()
            expected = Counter(
                unsent.as_shown(status_now, status, reason)[0]
                for status, reason, _ in rows.values()
            )
            assert {k: v for k, v in shown.items() if v} == dict(expected)
            if status_now != "sending":
                assert shown["queued"] == 0

        def teardown(self):
            with db.begin(push_app) as session:
                ended = session.get(Campaign, self.campaign).status != "sending"
            if not ended:
                return
            dispatcher.settings = replace(dispatcher.settings, unsent_chunk=3, unsent_seconds=60)
            clock.advance(dt.timedelta(minutes=5))  # every sender left has stopped
            dispatcher.skip_unsent()
            rows = self._rows()
            assert not [r for r in rows.values() if r[0] in ("queued", "sending")], rows
            with db.begin(push_app) as session:
                # One that never had a delivery left behind is the table-retention job's
                # to keep (settled.to_settle), as before.
                settled.settle(session, [self.campaign])
                kept = session.get(Campaign, self.campaign).settled_counts
            assert kept == dict(Counter(status for status, _, _ in rows.values())), (kept, rows)

    run_state_machine_as_test(
        Marking,
        settings=settings(
            max_examples=60,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )


def test_deliveries_answered_try_again_later_and_then_cancelled_are_named_under_slowdowns(
    push_app, dispatcher, clock, fake_push
):
    """Three deliveries answered 503 once and never tried again (the campaign was
    cancelled first): the slowed-down section names them, and does not say that no push
    service was slowed down (it had said so)."""
    subscriptions = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(7)]
    for subscription in subscriptions[:3]:
        fake_push.script(subscription, 503)
    campaign_id = make_campaign(push_app, clock)
    dispatcher.advance_campaigns()
    dispatcher.tick()
    assert rows(push_app, campaign_id) == Counter(
        {("accepted", None): 4, ("queued", "server_error"): 3}
    )

    def slowdowns():
        with db.begin(push_app) as session:
            campaign = session.get(Campaign, campaign_id)
            reading = outcome.read(session, campaign, now=clock.now())
            circuits = outcome.circuits_seen(session, campaign, now=clock.now())
            return outcome.slowdowns(circuits, reading.retries, finished=True)

    with db.begin(push_app) as session:
        services.control(session, campaign_id, "cancel", now=clock.now())
    before = slowdowns()
    assert before == [
        "other: 3 deliveries answered 503 Service Unavailable (try again later) and not tried again"
    ]
    dispatcher.tick()  # marks the three skipped
    assert rows(push_app, campaign_id) == Counter(
        {("accepted", None): 4, ("skipped", "cancelled"): 3}
    )
    assert slowdowns() == before
