"""Cancel, pause and retire while a campaign's deliveries are being materialised (issue:
a cancel landing during a batch once left 5,000 deliveries queued on a cancelled campaign).

One thread materialises as the scheduler does (``Dispatcher.advance_campaigns``, a batch
per transaction on its own connection); the test cancels, pauses or retires the topic from
another connection at a seeded random moment. The state change and a batch must exclude
each other: after a cancel nothing can be sent, the pages count every delivery skipped as
cancelled, and once the dispatcher has marked what was left queued
(``Dispatcher.skip_unsent``) so does every row; after a pause or a retirement the campaign
gains no delivery it did not have when the change committed. On SQLite the write lock already serialises them (BEGIN IMMEDIATE); on
PostgreSQL the campaign row is what both lock.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
import uuid
from collections import Counter

import pytest
import sqlalchemy as sa
from flask import Flask

from portal.campaigns import outcome, unsent
from portal.campaigns import services as campaigns
from portal.campaigns.models import Campaign, CampaignStatus
from portal.campaigns.services import CampaignDraft
from portal.consent import catalogue
from portal.db import db, uuid7
from portal.delivery.engine import Dispatcher, EngineSettings
from portal.delivery.models import Delivery, DeliveryStatus
from portal.seams import current_portal
from portal.subscriptions.models import PushSubscription, Subscriber, SubscriptionState
from portal.subscriptions.validation import endpoint_hash

pytestmark = pytest.mark.slow

AUDIENCE = 6000
BATCH = 150  # 40 batches: a random moment nearly always falls inside or between batches
RUNS = 50


def insert_audience(app: Flask, count: int) -> None:
    """``count`` US subscribers (marketing defaults allow them) with one live device each,
    inserted set-based."""
    now = dt.datetime.now(dt.UTC)
    keys = current_portal(app).keys
    sealed = keys.seal(b"0123456789abcdef")
    subscribers, devices = [], []
    for n in range(count):
        subscriber_id = uuid7()
        endpoint = f"https://fcm.googleapis.com/fcm/send/race-{n}"
        subscribers.append({"id": subscriber_id, "region_code": "US", "created_at": now})
        devices.append(
            {
                "id": uuid7(),
                "endpoint": endpoint,
                "endpoint_hash": endpoint_hash(endpoint),
                "push_service": "fcm",
                "p256dh": "B" * 87,
                "auth_sealed": sealed.sealed,
                "auth_key_version": sealed.key_version,
                "subscriber_id": subscriber_id,
                "origin": "https://portal.example.test",
                "state": SubscriptionState.ACTIVE,
                "created_at": now,
                "last_seen_at": now,
            }
        )
    with db.begin(app) as session:
        session.execute(sa.insert(Subscriber), subscribers)
        session.execute(sa.insert(PushSubscription), devices)


class Materialising:
    """The scheduler's bookkeeping in a thread of its own, batch after batch, until told to
    stop; the main thread changes the campaign meanwhile."""

    def __init__(self, app: Flask) -> None:
        self.engine = Dispatcher(
            app, transport=None, settings=EngineSettings(materialise_batch=BATCH)
        )  # type: ignore[arg-type]  # advance_campaigns never sends
        self.stopping = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.engine.advance_campaigns()
        except BaseException as error:  # reported by the test, not lost in the thread
            self.errors.append(error)

    def __enter__(self) -> Materialising:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the materialising thread did not stop"
        assert self.errors == [], self.errors


@pytest.fixture
def race_app(catalogue_ready: Flask) -> Flask:
    insert_audience(catalogue_ready, AUDIENCE)
    return catalogue_ready


def launch(app: Flask, topic: str = "weekly-digest") -> uuid.UUID:
    """A campaign due now: the next bookkeeping pass starts it and materialises."""
    draft = CampaignDraft(topic=topic, title="Monday digest", body="Five things", url="/news")
    with db.begin(app) as session:
        return campaigns.create_campaign(session, draft, created_by="test", now=now(app)).id


def now(app: Flask) -> dt.datetime:
    return current_portal(app).clock.now()


def counts(app: Flask, campaign_id: uuid.UUID) -> Counter[tuple[str, str | None]]:
    with db.begin(app) as session:
        rows = session.execute(
            sa.select(Delivery.status, Delivery.reason, sa.func.count())
            .where(Delivery.campaign_id == campaign_id)
            .group_by(Delivery.status, Delivery.reason)
        ).all()
    return Counter({(status, reason): n for status, reason, n in rows})


def total(found: Counter[tuple[str, str | None]]) -> int:
    return sum(found.values())


def wait_until_materialising(app: Flask, campaign_id: uuid.UUID) -> None:
    """The campaign has started: it is sending (its first batch may be under way)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with db.begin(app) as session:
            status = session.execute(
                sa.select(Campaign.status).where(Campaign.id == campaign_id)
            ).scalar_one()
        if status == CampaignStatus.SENDING.value:
            return
        time.sleep(0.002)
    raise AssertionError("the campaign never started")


def shown_counts(app: Flask, campaign_id: uuid.UUID) -> dict[str, int]:
    """The campaign page's counts by status (``outcome.read``), those above zero."""
    with db.begin(app) as session:
        campaign = session.get(Campaign, campaign_id)
        assert campaign is not None
        shown = outcome.read(session, campaign, now=now(app)).facts
    return {status: n for status, n in shown.counts.items() if n}


def mark_unsent(app: Flask) -> int:
    """The dispatcher's marking of what ended campaigns left queued, to the end."""
    dispatcher = Dispatcher(app, transport=None)  # type: ignore[arg-type]
    marked = 0
    while more := dispatcher.skip_unsent():
        marked += more
    return marked


def campaign_page_adds_up(app: Flask, campaign_id: uuid.UUID) -> None:
    """The campaign page's figures (what ``outcome.read`` finds, and the headline made
    of them) add up to the rows there are, each counted by the rule for a delivery an
    ended campaign left queued (``unsent.as_shown``)."""
    with db.begin(app) as session:
        campaign = session.get(Campaign, campaign_id)
        assert campaign is not None
        shown = outcome.read(session, campaign, now=now(app)).facts
        status_now = campaign.status
    found = counts(app, campaign_id)
    assert shown.total == total(found) == sum(shown.counts.values())
    assert sum(n for _, n in outcome.headline(shown).parts) == shown.total
    by_status = Counter[str]()
    for (status, reason), n in found.items():
        by_status[unsent.as_shown(status_now, status, reason)[0]] += n
    assert {k: v for k, v in shown.counts.items() if v} == dict(by_status)


def expire(app: Flask, campaign_id: uuid.UUID) -> None:
    """``deliver_until`` passes, and another process's bookkeeping pass expires it."""
    with db.begin(app) as session:
        session.execute(
            sa.update(Campaign)
            .where(Campaign.id == campaign_id)
            .values(deliver_until=now(app) - dt.timedelta(seconds=1))
        )
    Dispatcher(app, transport=None).advance_campaigns()  # type: ignore[arg-type]


@pytest.mark.postgres_only
@pytest.mark.parametrize(
    ("change", "runs", "reason"),
    [("cancel", RUNS, "cancelled"), ("expire", 20, "deliver_until_passed")],
)
def test_a_cancel_or_expiry_at_any_moment_of_materialisation_leaves_nothing_queued(
    race_app, change, runs, reason
):
    app = race_app
    moments = random.Random(f"{change}-20261201")
    seen_mid_way = 0
    with Materialising(app):
        for run in range(runs):
            campaign_id = launch(app)
            wait_until_materialising(app, campaign_id)
            time.sleep(moments.uniform(0, 0.6))
            if change == "cancel":
                with db.begin(app) as session:
                    campaigns.control(session, campaign_id, "cancel", now=now(app))
            else:
                expire(app, campaign_id)
            # Whatever batch was under way has ended by now; the campaign gains no more.
            time.sleep(0.05)
            at_end = counts(app, campaign_id)
            expected = {DeliveryStatus.SKIPPED.value: total(at_end)} if at_end else {}
            assert shown_counts(app, campaign_id) == expected, (
                f"run {run}: the page counts deliveries that could still go: {at_end}"
            )
            campaign_page_adds_up(app, campaign_id)
            mark_unsent(app)
            found = counts(app, campaign_id)
            assert set(found) <= {(DeliveryStatus.SKIPPED.value, reason)}, (
                f"run {run}: an ended campaign kept deliveries that could still go: {found}"
            )
            assert total(found) == total(at_end)
            seen_mid_way += 0 < total(found) < AUDIENCE
            campaign_page_adds_up(app, campaign_id)
    # The moments really fell during materialisation, not all before or after it.
    assert seen_mid_way >= runs // 2, seen_mid_way


@pytest.mark.postgres_only
@pytest.mark.parametrize("change", ["pause", "retire"])
def test_a_pause_or_a_retired_topic_stops_materialisation_where_it_committed(race_app, change):
    app = race_app
    moments = random.Random(f"{change}-20261201")
    seen_mid_way = 0
    for run in range(RUNS // 2):
        topic = "weekly-digest"
        if change == "retire":  # a topic of its own each run, with the same audience
            topic = f"digest-{run}"
            with db.begin(app) as session:
                catalogue.add_topic(
                    session,
                    slug=topic,
                    category="News",
                    label=f"Digest {run}",
                    description="Weekly.",
                    transactional=False,
                    default_state="opt_in",
                    now=now(app),
                )
        with Materialising(app):
            campaign_id = launch(app, topic)
            wait_until_materialising(app, campaign_id)
            time.sleep(moments.uniform(0, 0.6))
            with db.begin(app) as session:
                if change == "pause":
                    campaigns.control(session, campaign_id, "pause", now=now(app))
                else:
                    catalogue.retire_topic(session, topic, now=now(app))
            at_change = total(counts(app, campaign_id))
            time.sleep(0.3)  # several more bookkeeping passes
            later = total(counts(app, campaign_id))
        assert later == at_change, (
            f"run {run}: {later - at_change} deliveries appeared after the {change} committed"
        )
        seen_mid_way += 0 < at_change < AUDIENCE
        campaign_page_adds_up(app, campaign_id)
        if change == "pause":
            with db.begin(app) as session:
                campaigns.control(session, campaign_id, "cancel", now=now(app))
    assert seen_mid_way >= RUNS // 4, seen_mid_way


def test_without_a_race_a_cancelled_campaign_is_all_skipped(race_app):
    """Both databases: cancel after the whole audience is materialised."""
    app = race_app
    campaign_id = launch(app)
    engine = Dispatcher(app, transport=None, settings=EngineSettings(materialise_batch=2000))  # type: ignore[arg-type]
    while True:
        engine.advance_campaigns()
        with db.begin(app) as session:
            campaign = session.get(Campaign, campaign_id)
            assert campaign is not None
            if campaign.materialised_at is not None:
                break
    with db.begin(app) as session:
        campaigns.control(session, campaign_id, "cancel", now=now(app))
    # At once on the pages; in the rows once the dispatcher has marked them.
    assert shown_counts(app, campaign_id) == {DeliveryStatus.SKIPPED.value: AUDIENCE}
    assert counts(app, campaign_id) == Counter({(DeliveryStatus.QUEUED.value, None): AUDIENCE})
    campaign_page_adds_up(app, campaign_id)
    assert mark_unsent(app) == AUDIENCE
    assert counts(app, campaign_id) == Counter(
        {(DeliveryStatus.SKIPPED.value, "cancelled"): AUDIENCE}
    )
    campaign_page_adds_up(app, campaign_id)
