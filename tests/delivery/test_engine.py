"""The dispatch engine end to end against a fake push service that decrypts everything."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time

import pytest
import sqlalchemy as sa

from portal.campaigns import services as campaigns
from portal.campaigns.models import Campaign, CircuitState
from portal.campaigns.services import CampaignDraft
from portal.db import db, uuid7
from portal.delivery.engine import Dispatcher, EngineSettings
from portal.delivery.models import Delivery
from portal.jobs import run_job
from portal.subscriptions.models import PushSubscription
from tests.fakepush import Answer
from tests.helpers import sent_statements


def _subscribe(app, fake_push, *, region=None, topics=None):
    sub = fake_push.subscribe()
    client = app.test_client()
    body = {"subscription": sub.to_json()}
    if topics is not None:
        body |= {"topics": topics, "policyVersion": "v1"}
    response = client.post("/api/push/subscribe", json=body)
    assert response.status_code == 201, response.json
    if region:
        with db.begin(app) as session:
            session.execute(
                sa.text(
                    "UPDATE subscriber SET region_code = :r WHERE id = (SELECT subscriber_id FROM push_subscription WHERE endpoint = :e)"
                ),
                {"r": region, "e": sub.endpoint},
            )
    return sub


def _launch(app, clock, topic="weekly-digest", **extra):
    with db.begin(app) as session:
        draft = CampaignDraft(
            topic=topic, title="Monday digest", body="Five things this week", url="/news", **extra
        )
        return campaigns.create_campaign(session, draft, created_by="test", now=clock.now()).id


def _rows(app, model):
    """Rows as dicts of Python values (aware datetimes, UUIDs) on both databases."""
    with db.begin(app) as session:
        return [
            {c.name: getattr(obj, c.key) for c in model.__table__.columns}
            for obj in session.scalars(
                sa.select(model).order_by(*model.__table__.primary_key.columns)
            )
        ]


def test_every_allowed_recipient_gets_exactly_one_readable_message(
    push_app, dispatcher, fake_push, clock, engine
):
    us_default = _subscribe(push_app, fake_push, region="US")  # marketing default applies
    eu_default = _subscribe(push_app, fake_push, region="EU")  # it does not
    eu_opted_in = _subscribe(push_app, fake_push, region="EU", topics=["weekly-digest"])
    us_opted_out = _subscribe(push_app, fake_push, region="US", topics=[])
    unknown_region = _subscribe(push_app, fake_push)
    campaign_id = _launch(push_app, clock)

    report = dispatcher.tick()

    assert report.accepted == 2
    for sub in (us_default, eu_opted_in):
        (message,) = fake_push.plaintexts(sub)
        content = json.loads(message)
        assert content["title"] == "Monday digest"
        assert content["body"] == "Five things this week"
        assert content["url"] == "/news"
        assert content["tag"] == f"campaign-{campaign_id}"
        assert content["campaignId"] == str(campaign_id)
        assert int(content["deliveryId"]) > 0
    for sub in (eu_default, us_opted_out, unknown_region):
        assert fake_push.received(sub) == []
    rows = _rows(push_app, Delivery)
    assert len(rows) == 2
    assert {r["status"] for r in rows} == {"accepted"}
    assert {r["consent_reason"] for r in rows} == {"default_by_region", "explicit_opt_in"}
    opted = next(r for r in rows if r["consent_reason"] == "explicit_opt_in")
    with engine.connect() as conn:
        kind = conn.execute(
            sa.text("SELECT kind, new_state FROM consent_event WHERE seq = :s"),
            {"s": opted["consent_event_seq"]},
        ).one()
    assert tuple(kind) == ("preference_changed", "opt_in")  # proof of consent per send
    states = {r["endpoint"]: r["state"] for r in _rows(push_app, PushSubscription)}
    assert states[us_default.endpoint] == "active"
    with db.begin(push_app) as session:
        assert session.get(Campaign, campaign_id).status == "completed"
    # Nothing is sent twice, however often the engine ticks.
    dispatcher.tick()
    assert len(fake_push.received()) == 2


def test_headers_carry_ttl_urgency_and_topic(push_app, dispatcher, fake_push, clock):
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    _launch(push_app, clock, ttl=600, urgency="high", collapse_key="digest")
    dispatcher.tick()
    (received,) = fake_push.received(sub)
    assert received.headers["ttl"] == "600"
    assert received.headers["urgency"] == "high"
    assert received.headers["topic"] == "digest"
    assert received.headers["content-encoding"] == "aes128gcm"


def test_gone_revokes_at_once_with_a_consent_event(push_app, dispatcher, fake_push, clock, engine):
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    fake_push.script(sub, 410)
    _launch(push_app, clock)
    report = dispatcher.tick()
    assert report.revoked == 1
    (delivery,) = _rows(push_app, Delivery)
    assert delivery["status"] == "revoked"
    (row,) = _rows(push_app, PushSubscription)
    assert (row["state"], row["end_reason"]) == ("revoked", "revoked_by_push_service")
    with engine.connect() as conn:
        assert (
            conn.execute(
                sa.text("SELECT count(*) FROM consent_event WHERE kind = 'revoked_by_push_service'")
            ).scalar_one()
            == 1
        )
    metrics = push_app.test_client().get("/metrics").text
    assert 'push_token_pruned_total{provider="other"}' in metrics
    assert "push_token_pruned_current 1.0" in metrics
    assert 'push_send_attempts_total{provider="other",status="410"}' in metrics
    assert len(fake_push.received(sub)) == 1  # no retry after a 410
    # A revoked subscription is skipped by the next campaign.
    _launch(push_app, clock)
    dispatcher.tick()
    assert len(fake_push.received(sub)) == 1


def test_three_404s_in_a_row_make_the_subscription_stale(
    push_app, dispatcher, fake_push, clock, engine
):
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    fake_push.script(sub, 404, 404, 404)
    for expected in ("pending", "pending", "stale"):
        _launch(push_app, clock)
        dispatcher.tick()
        (row,) = _rows(push_app, PushSubscription)
        assert row["state"] == expected
    assert {d["status"] for d in _rows(push_app, Delivery)} == {"failed"}
    assert len(fake_push.received(sub)) == 3


def test_rate_limit_is_retried_after_retry_after(push_app, dispatcher, fake_push, clock, engine):
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    fake_push.script(sub, Answer.of(429, retry_after=30))
    _launch(push_app, clock)
    report = dispatcher.tick()
    assert report.retried == 1
    (delivery,) = _rows(push_app, Delivery)
    assert delivery["status"] == "queued"
    assert delivery["next_attempt_at"] >= clock.now() + dt.timedelta(seconds=30)
    (row,) = _rows(push_app, PushSubscription)
    assert (row["state"], row["consecutive_failures"]) == ("pending", 0)  # lifecycle untouched
    clock.advance(seconds=29)
    dispatcher.tick()
    assert len(fake_push.received(sub)) == 1
    clock.advance(seconds=2)
    dispatcher.tick()
    (delivery,) = _rows(push_app, Delivery)
    assert (delivery["status"], delivery["attempts"]) == ("accepted", 2)


def test_retry_after_as_an_http_date(push_app, dispatcher, fake_push, clock, engine):
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    # The engine's clock is 2026-01-01; the date is read against the real clock by the
    # transport, so give a date far enough ahead to be unmistakable.
    fake_push.script(sub, Answer.of(503, retry_after="Fri, 01 Jan 2100 00:00:00 GMT"))
    _launch(push_app, clock)
    dispatcher.tick()
    (delivery,) = _rows(push_app, Delivery)
    assert delivery["status"] == "queued"
    # Read as far as it may be: four weeks (lifecycle.MAX_RETRY_AFTER), plus the jitter.
    assert delivery["next_attempt_at"] >= clock.now() + dt.timedelta(days=28)
    assert delivery["next_attempt_at"] <= clock.now() + dt.timedelta(days=28 * 1.3)


@pytest.mark.parametrize(
    "value",
    ["\u00b2", "9" * 400, "Fri, 31 Dec 9999 23:59:59 GMT"],
    ids=["superscript-two", "400-digits", "year-9999"],
)
def test_an_odd_retry_after_is_that_delivery_s_alone(
    push_app, dispatcher, fake_push, clock, engine, value
):
    """A Retry-After that str.isdigit() takes and float() refuses ('²'), or one too
    large for a date, raised while the batch was out (the tick ended): every delivery of the batch went
    unanswered until their lease ran out, and a push service answering so every time stalled
    the campaign."""
    subs = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(3)]
    fake_push.script(subs[0], Answer.of(429, retry_after=value))
    _launch(push_app, clock)
    report = dispatcher.tick()
    assert (report.accepted, report.retried) == (2, 1)
    queued = [row for row in _rows(push_app, Delivery) if row["status"] == "queued"]
    assert len(queued) == 1
    assert queued[0]["next_attempt_at"] <= clock.now() + dt.timedelta(days=28 * 1.3)


@pytest.mark.parametrize(
    "answer", [500, 502, Answer.connection_reset()], ids=["500", "502", "reset"]
)
def test_transient_failures_back_off_then_fail_after_max_attempts(
    push_app, dispatcher, fake_push, clock, engine, answer
):
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    fake_push.script(sub, *([answer] * 5))
    _launch(push_app, clock)
    delays = []
    for _ in range(5):
        dispatcher.tick()
        (delivery,) = _rows(push_app, Delivery)
        if delivery["status"] != "queued":
            break
        delays.append((delivery["next_attempt_at"] - clock.now()).total_seconds())
        clock.advance(seconds=70)
    assert delays == [1, 2, 4, 8]  # min(1 s × 2^(n−1), 64 s), jitter pinned to 0 here
    (delivery,) = _rows(push_app, Delivery)
    assert (delivery["status"], delivery["reason"], delivery["attempts"]) == (
        "failed",
        "max_attempts",
        5,
    )
    (row,) = _rows(push_app, PushSubscription)
    assert (row["state"], row["consecutive_failures"]) == ("pending", 0)


def test_other_client_errors_fail_the_delivery_only(push_app, dispatcher, fake_push, clock, engine):
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    fake_push.script(sub, 400)
    _launch(push_app, clock)
    dispatcher.tick()
    (delivery,) = _rows(push_app, Delivery)
    assert (delivery["status"], delivery["last_status_code"]) == ("failed", 400)
    (row,) = _rows(push_app, PushSubscription)
    assert (row["state"], row["consecutive_failures"]) == ("pending", 0)
    assert len(fake_push.received(sub)) == 1


def test_wns_406_is_a_rate_limit(push_app, dispatcher, fake_push, clock, engine):
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE push_subscription SET push_service = 'wns'"))
    fake_push.script(sub, 406)
    _launch(push_app, clock)
    dispatcher.tick()
    (delivery,) = _rows(push_app, Delivery)
    assert (delivery["status"], delivery["push_service"]) == ("queued", "wns")


def test_opt_out_after_launch_is_skipped(push_app, dispatcher, fake_push, clock, engine):
    stays = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    leaves = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    _launch(push_app, clock)
    dispatcher.advance_campaigns()  # the audience is materialised…
    assert len(_rows(push_app, Delivery)) == 2
    withdrawal = push_app.test_client().post(
        "/api/push/preferences",
        json={
            "endpoint": leaves.endpoint,
            "auth": leaves.auth_b64,
            "decisions": [{"slug": "weekly-digest", "state": "opt_out"}],
            "policyVersion": "v1",
            "decidedAt": "2025-12-31T23:59:00Z",
        },
    )
    assert withdrawal.status_code == 200
    push_app.test_client().post(
        "/api/push/unsubscribe", json={"endpoint": stays.endpoint, "auth": stays.auth_b64}
    )
    dispatcher.tick()  # …and re-checked at send time
    reasons = sorted(d["reason"] for d in _rows(push_app, Delivery))
    assert reasons == ["consent_withdrawn", "subscription_revoked"]
    assert fake_push.received() == []


def test_pause_resume_and_cancel(push_app, dispatcher, fake_push, clock, engine):
    subs = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(3)]
    campaign_id = _launch(push_app, clock)
    with db.begin(push_app) as session:
        campaigns.control(session, campaign_id, "pause", now=clock.now())
    dispatcher.tick()
    assert fake_push.received() == []
    with db.begin(push_app) as session:
        campaigns.control(session, campaign_id, "resume", now=clock.now())
    dispatcher.tick()
    assert len(fake_push.received()) == 3

    other = _launch(push_app, clock)
    dispatcher.advance_campaigns()
    with db.begin(push_app) as session:
        campaigns.control(session, other, "cancel", now=clock.now())
        with pytest.raises(Exception, match="cannot resume"):
            campaigns.control(session, other, "resume", now=clock.now())
    dispatcher.tick()
    left = [d for d in _rows(push_app, Delivery) if d["campaign_id"] == other]
    assert {d["status"] for d in left} == {"skipped"}  # nothing left queued
    assert len(fake_push.received()) == 3
    assert len(subs) == 3


def test_pause_stops_new_sends_within_one_tick(push_app, dispatcher, fake_push, clock, engine):
    for _ in range(120):
        _subscribe(push_app, fake_push, topics=["weekly-digest"])
    campaign_id = _launch(push_app, clock)
    dispatcher.tick(max_batches=1)  # one batch of 50 sent
    with db.begin(push_app) as session:
        campaigns.control(session, campaign_id, "pause", now=clock.now())
    dispatcher.tick()
    assert len(fake_push.received()) == 50


def test_a_scheduled_campaign_waits_and_deliver_until_expires_it(
    push_app, dispatcher, fake_push, clock, engine
):
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    _launch(push_app, clock, send_at=clock.now() + dt.timedelta(hours=1))
    dispatcher.tick()
    assert fake_push.received(sub) == []
    clock.advance(hours=1, seconds=1)
    dispatcher.tick()
    assert len(fake_push.received(sub)) == 1

    fake_push.script(sub, Answer.of(429, retry_after=600))
    late = _launch(push_app, clock, deliver_until=clock.now() + dt.timedelta(minutes=5))
    dispatcher.tick()
    clock.advance(minutes=6)
    dispatcher.tick()
    mine = [d for d in _rows(push_app, Delivery) if d["campaign_id"] == late]
    assert [(d["status"], d["reason"]) for d in mine] == [("skipped", "deliver_until_passed")]


def test_run_job_dispatch_uses_the_process_dispatcher(push_app, dispatcher, fake_push, clock):
    _subscribe(push_app, fake_push, topics=["weekly-digest"])
    _launch(push_app, clock)
    report = run_job(push_app, "dispatch")
    assert (report.processed, report.changed) == (1, 1)
    assert len(fake_push.received()) == 1


class _SlowService:
    """A transport whose batch takes longer than its lease: ``hold`` runs before sending."""

    def __init__(self, inner, hold):
        self.inner, self.hold = inner, hold

    def send(self, request):
        return self.inner.send(request)

    def send_batch(self, requests):
        requests = list(requests)
        self.hold()
        return self.inner.send_batch(requests)


def test_a_batch_sent_for_longer_than_its_lease_is_not_taken_by_another_process(
    push_app, dispatcher, fake_push, clock
):
    subs = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(3)]
    _launch(push_app, clock)
    short = EngineSettings(batch_size=50, lease_seconds=0.3)
    other = Dispatcher(push_app, dispatcher.transport, settings=short, rand=lambda: 0.0)
    taken = []

    def hold():
        # The push service is slow: the batch's first lease has run out meanwhile.
        clock.advance(seconds=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the sender renews its lease as it goes
            with db.begin(push_app) as session:
                leases = session.scalars(
                    sa.select(Delivery.lease_expires_at).where(Delivery.status == "sending")
                ).all()
            if all(lease > clock.now() for lease in leases):
                break
            time.sleep(0.05)
        taken.extend(other.claim())  # a second process looking for work meanwhile

    sender = Dispatcher(
        push_app, _SlowService(dispatcher.transport, hold), settings=short, rand=lambda: 0.0
    )
    report = sender.tick()
    assert taken == []
    assert report.accepted == 3
    for sub in subs:
        assert len(fake_push.received(sub)) == 1
    assert {d["status"] for d in _rows(push_app, Delivery)} == {"accepted"}


def test_an_answer_to_a_delivery_another_process_already_answered_changes_nothing(
    push_app, dispatcher, fake_push, clock
):
    # This process's lease ran out while its batch was out; another process sent the
    # batch again and recorded its answers first. The late answers (an acceptance, a 410)
    # leave those deliveries as they are: the answer recorded first stands, and a
    # finished campaign with nothing out never changes again.
    subs = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(3)]
    fake_push.script(subs[1], 410)
    _launch(push_app, clock)

    def answered_elsewhere():
        with db.begin(push_app) as session:
            session.execute(
                sa.update(Delivery)
                .where(Delivery.status == "sending")
                .values(status="failed", reason="rejected_400", lease_expires_at=None)
            )

    sender = Dispatcher(push_app, _SlowService(dispatcher.transport, answered_elsewhere))
    sender.tick()

    assert {(d["status"], d["reason"]) for d in _rows(push_app, Delivery)} == {
        ("failed", "rejected_400")
    }


def test_a_campaign_the_dispatcher_completes_keeps_its_counts_in_that_transaction(
    push_app, dispatcher, fake_push, clock
):
    subs = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(4)]
    fake_push.script(subs[1], 410)
    fake_push.script(subs[2], 404)
    campaign_id = _launch(push_app, clock)
    with db.begin(push_app) as session:
        assert session.get(Campaign, campaign_id).settled_counts is None

    dispatcher.tick()  # sends everything, then nothing is left: completed, counts kept

    with db.begin(push_app) as session:
        campaign = session.get(Campaign, campaign_id)
        assert campaign.status == "completed"
        assert campaign.settled_counts == {"accepted": 2, "revoked": 1, "failed": 1}
        listed = {r.campaign.id: r.counts for r in campaigns.list_campaigns(session).rows}
    assert {s: n for s, n in listed[campaign_id].items() if n} == campaign.settled_counts


def test_one_batch_of_mixed_answers_records_each_answer(
    push_app, dispatcher, fake_push, clock, engine
):
    subs = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(6)]
    with engine.begin() as conn:  # two failures behind it: an acceptance clears them
        conn.execute(
            sa.text("UPDATE push_subscription SET consecutive_failures = 2 WHERE endpoint = :e"),
            {"e": subs[1].endpoint},
        )
    fake_push.script(subs[2], Answer(200))
    fake_push.script(subs[3], 410)
    fake_push.script(subs[5], 404)
    _launch(push_app, clock)

    report = dispatcher.tick()  # one claim: the batch holds all six

    assert (report.claimed, report.accepted, report.revoked, report.failed) == (6, 4, 1, 1)
    by_id = {r["id"]: r for r in _rows(push_app, PushSubscription)}
    deliveries = {by_id[d["subscription_id"]]["endpoint"]: d for d in _rows(push_app, Delivery)}
    expected = [
        ("accepted", 201, "active", 0, True),
        ("accepted", 201, "active", 0, True),
        ("accepted", 200, "active", 0, True),
        ("revoked", 410, "revoked", 0, False),
        ("accepted", 201, "active", 0, True),
        ("failed", 404, "pending", 1, False),
    ]
    for sub, (status, code, state, failures, succeeded) in zip(subs, expected, strict=True):
        delivery = deliveries[sub.endpoint]
        row = next(r for r in by_id.values() if r["endpoint"] == sub.endpoint)
        assert (delivery["status"], delivery["last_status_code"]) == (status, code)
        assert delivery["lease_expires_at"] is None
        assert (row["state"], row["last_status_code"], row["consecutive_failures"]) == (
            state,
            code,
            failures,
        )
        assert (row["last_success_at"] == clock.now()) is succeeded
    assert {len(fake_push.received(sub)) for sub in subs} == {1}


def test_a_row_sealed_under_an_unknown_key_version_fails_alone(
    push_app, dispatcher, fake_push, clock, engine, caplog
):
    subs = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(3)]
    with engine.begin() as conn:  # sealed under a key this process does not hold
        conn.execute(
            sa.text("UPDATE push_subscription SET auth_key_version = 9 WHERE endpoint = :e"),
            {"e": subs[1].endpoint},
        )
    _launch(push_app, clock)

    report = dispatcher.tick()

    assert (report.accepted, report.skipped) == (2, 1)
    assert fake_push.received(subs[1]) == []
    for sub in (subs[0], subs[2]):
        assert len(fake_push.plaintexts(sub)) == 1
    by_id = {r["id"]: r for r in _rows(push_app, PushSubscription)}
    deliveries = {by_id[d["subscription_id"]]["endpoint"]: d for d in _rows(push_app, Delivery)}
    unreadable = deliveries.pop(subs[1].endpoint)
    assert (unreadable["status"], unreadable["reason"]) == ("skipped", "unreadable_keys")
    assert {d["status"] for d in deliveries.values()} == {"accepted"}
    row = next(r for r in by_id.values() if r["endpoint"] == subs[1].endpoint)
    # Not the subscription's fault: its lifecycle is untouched, and the log says why.
    assert (row["state"], row["consecutive_failures"], row["auth_key_version"]) == (
        "pending",
        0,
        9,
    )
    assert "no data key for auth_key_version 9" in caplog.text


def _sender(push_app, dispatcher, **settings):
    """A dispatcher on the same transport with these engine settings, without jitter."""
    return Dispatcher(
        push_app, dispatcher.transport, settings=EngineSettings(**settings), rand=lambda: 0.0
    )


def _one_at_a_time(push_app, dispatcher, **settings):
    """A dispatcher on the same transport sending one delivery per batch, so consecutive
    batches meet: on PostgreSQL a batch is planned while the previous one is written."""
    return _sender(push_app, dispatcher, batch_size=1, **settings)


def test_a_410_is_seen_by_the_next_batch_before_it_is_written(
    push_app, dispatcher, fake_push, clock, engine
):
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    fake_push.script(sub, 410)
    first, second = _launch(push_app, clock), _launch(push_app, clock)
    report = _one_at_a_time(push_app, dispatcher).tick()
    assert (report.revoked, report.skipped) == (1, 1)
    assert len(fake_push.received(sub)) == 1  # the second campaign never sends to it
    status = {d["campaign_id"]: (d["status"], d["reason"]) for d in _rows(push_app, Delivery)}
    assert status == {first: ("revoked", "gone"), second: ("skipped", "subscription_revoked")}
    with engine.connect() as conn:
        events = conn.execute(
            sa.text(
                "SELECT previous_state FROM consent_event WHERE kind = 'revoked_by_push_service'"
            )
        ).all()
    assert [tuple(e) for e in events] == [("pending",)]


def test_404s_in_consecutive_batches_count_up_to_stale(
    push_app, dispatcher, fake_push, clock, engine
):
    sub = _subscribe(push_app, fake_push, topics=["weekly-digest"])
    fake_push.script(sub, 404, 404, 404)
    for _ in range(4):
        _launch(push_app, clock)
    report = _one_at_a_time(push_app, dispatcher).tick()
    (row,) = _rows(push_app, PushSubscription)
    assert (row["state"], row["consecutive_failures"]) == ("stale", 3)
    assert len(fake_push.received(sub)) == 3  # the fourth campaign finds it stale
    assert (report.failed, report.skipped) == (3, 1)
    reasons = sorted(d["reason"] for d in _rows(push_app, Delivery))
    assert reasons == ["not_found_404"] * 3 + ["subscription_stale"]


def test_a_circuit_opened_by_one_batch_holds_back_the_next(
    push_app, dispatcher, fake_push, clock, engine
):
    throttled = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(2)]
    waiting = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(2)]
    for sub in throttled:
        fake_push.script(sub, Answer.of(429, retry_after=30))
    _launch(push_app, clock)
    engine_ = _sender(push_app, dispatcher, batch_size=2, circuit_min=2, circuit_ratio=0.5)
    report = engine_.tick()
    assert report.retried == 2
    assert report.accepted == 0
    for sub in waiting:
        assert fake_push.received(sub) == []  # claimed only once the circuit closes
    (circuit,) = _rows(push_app, CircuitState)
    assert circuit["push_service"] == "other"
    assert circuit["reason"] == "2 of 2 answers were 429/5xx"


def test_one_tick_materialises_and_sends_an_audience_of_several_batches(
    push_app, dispatcher, fake_push, clock
):
    """A tick goes on while a campaign has more of its audience to write: each
    materialisation batch says how many deliveries it wrote, and a tick ends only when one
    writes none (on PostgreSQL the count was lost once, and a tick stopped after the
    second batch, leaving the rest to later ticks)."""
    subscribed = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(5)]
    campaign_id = _launch(push_app, clock)
    report = _sender(push_app, dispatcher, batch_size=2, materialise_batch=2).tick()
    assert (report.materialised, report.accepted) == (5, 5)
    assert all(len(fake_push.received(sub)) == 1 for sub in subscribed)
    with db.begin(push_app) as session:
        assert session.get(Campaign, campaign_id).status == "completed"


def _cannot_be_materialised(monkeypatch, campaign_id, error: Exception) -> None:
    """Materialising ``campaign_id``'s audience raises ``error`` (the others' goes on)."""
    import portal.delivery.engine as engine_module

    real = engine_module.materialise_batch

    def materialise(session, campaign, **kwargs):
        if campaign.id == campaign_id:
            raise error
        return real(session, campaign, **kwargs)

    monkeypatch.setattr(engine_module, "materialise_batch", materialise)


def _hold_the_batch_of(app, campaign_id, release: threading.Event) -> threading.Thread:
    """Another process writing ``campaign_id``'s next batch until ``release`` is set: its
    materialisation lock held that long (10 s at most)."""
    held = threading.Event()

    def other_process() -> None:
        with db.begin(app) as session:
            assert campaigns._campaign_lock(session, campaign_id)
            held.set()
            release.wait(10)

    other = threading.Thread(target=other_process)
    other.start()
    assert held.wait(10)
    return other


@pytest.mark.postgres_only
def test_a_sender_waits_for_the_batch_another_process_is_writing(
    push_app, dispatcher, fake_push, clock
):
    """A sender whose queue is empty while another process writes the campaign's next
    batch waits for it and goes on sending (its tick used to end there, leaving it idle
    until its next tick, seconds later, at every batch of every campaign)."""
    subscribed = [_subscribe(push_app, fake_push, topics=["weekly-digest"]) for _ in range(5)]
    campaign_id = _launch(push_app, clock)
    release = threading.Event()
    other = _hold_the_batch_of(push_app, campaign_id, release)
    threading.Timer(0.5, release.set).start()
    sender = _sender(push_app, dispatcher, batch_size=2, materialise_batch=2)
    report = sender.tick()
    other.join(10)
    assert (report.materialised, report.accepted) == (5, 5)
    assert all(len(fake_push.received(sub)) == 1 for sub in subscribed)
    with db.begin(push_app) as session:
        assert session.get(Campaign, campaign_id).status == "completed"


@pytest.mark.postgres_only
def test_a_sender_waits_for_another_process_s_batch_only_so_long(
    push_app, dispatcher, fake_push, clock
):
    """The wait is bounded: a batch another process takes longer than
    ``materialise_wait`` to write ends this sender's tick (the next tick tries again)."""
    _subscribe(push_app, fake_push, topics=["weekly-digest"])
    campaign_id = _launch(push_app, clock)
    release = threading.Event()
    other = _hold_the_batch_of(push_app, campaign_id, release)
    try:
        sender = _sender(push_app, dispatcher, materialise_wait=0.3)
        started = time.monotonic()
        report = sender.tick()
        took = time.monotonic() - started
    finally:
        release.set()
        other.join(10)
    assert (report.materialised, report.accepted) == (0, 0)
    assert 0.3 <= took < 5
    assert fake_push.received() == []


@pytest.mark.parametrize("stopping", [False, True], ids=["going-on", "being-stopped"])
def test_a_short_claim_writes_the_next_batch_of_the_audience_ahead(
    push_app, dispatcher, fake_push, clock, stopping
):
    """When a claim comes back short (the queue running dry) the next batch of the
    audience is written there and then, while the batch in hand is sent and recorded,
    not only once some sender finds the queue empty and every sender waits for it; not
    by a worker being stopped, which sends what it holds and leaves the rest alone."""
    for _ in range(7):
        _subscribe(push_app, fake_push, topics=["weekly-digest"])
    _launch(push_app, clock)
    sender = _sender(push_app, dispatcher, batch_size=4, materialise_batch=3)
    stop = threading.Event()
    send = sender._send_leased

    def send_then_stop(*args, **kwargs):
        sent = send(*args, **kwargs)
        if stopping:
            stop.set()  # the worker is told to stop while this batch is out
        return sent

    sender._send_leased = send_then_stop
    report = sender.tick(stop=stop, max_batches=1)
    # 3 written as the tick began; the claim took those 3 of the 4 it asked for, so 3 more
    # were written before the next claim, unless the tick was being stopped.
    assert (report.claimed, report.materialised) == (3, 3 if stopping else 6)


@pytest.mark.postgres_only
def test_a_wait_for_another_s_batch_asks_little_and_retries_no_failing_campaign(
    push_app, dispatcher, fake_push, clock, monkeypatch, caplog, engine
):
    """While a sender waits for another process's batch it looks only at that batch
    (a few statements a look, ten looks a second), not at every step of advancing
    campaigns again: a campaign that cannot be materialised is tried, and said in the
    log, once per wait, not at every look."""
    import portal.delivery.engine as engine_module

    _subscribe(push_app, fake_push, topics=["weekly-digest"])
    written = _launch(push_app, clock)
    broken = _launch(push_app, clock)
    _cannot_be_materialised(monkeypatch, broken, ValueError("date value out of range"))
    release = threading.Event()
    other = _hold_the_batch_of(push_app, written, release)
    threading.Timer(1.0, release.set).start()
    sender = _sender(push_app, dispatcher)
    with sent_statements(engine) as sent:
        started = time.monotonic()
        report = sender.tick()
        took = time.monotonic() - started
    other.join(10)
    assert report.accepted == 1  # the batch it waited for
    assert took >= 0.9
    tries = caplog.text.count(f"campaign {broken}: its audience could not be materialised")
    # Tried as the tick begins, as the wait begins, ahead of the batch waited for, when
    # the queue is empty again and as the tick ends: never at the wait's ten looks.
    assert 1 <= tries <= 5, tries
    # A look: the claim (the circuits, the sending campaigns, each campaign's rows) and
    # whether that batch's lock is free yet. The rest of the tick: under 70 statements.
    looks = took / engine_module.MATERIALISE_POLL_SECONDS
    assert len(sent) <= 70 + 8 * looks, (len(sent), looks)


def test_a_campaign_that_cannot_be_materialised_fails_alone(
    push_app, dispatcher, fake_push, clock, monkeypatch, caplog
):
    """One campaign whose audience cannot be worked out (here: a time off the calendar,
    as rows from before the two-year rule could hold) is said in the log each run; the
    other campaigns are materialised and sent all the same."""
    for _ in range(2):
        _subscribe(push_app, fake_push, topics=["weekly-digest"])
    broken = _launch(push_app, clock)
    fine = _launch(push_app, clock)
    _cannot_be_materialised(monkeypatch, broken, OverflowError("date value out of range"))
    dispatcher.tick()
    dispatcher.tick()
    sent = [d for d in _rows(push_app, Delivery) if d["status"] == "accepted"]
    assert {d["campaign_id"] for d in sent} == {fine}
    assert len(fake_push.received()) == 2
    assert f"campaign {broken}: its audience could not be materialised" in caplog.text


def test_a_winner_time_off_the_calendar_fails_alone(push_app, dispatcher, clock, caplog):
    from portal.delivery.engine import _winner_is_due

    far = Campaign(
        id=uuid7(), send_at=dt.datetime(9999, 12, 31, 22, tzinfo=dt.UTC), winner_after=4 * 3600
    )
    far.test_share = 20
    assert _winner_is_due(far, clock.now()) is False
    assert f"campaign {far.id}: its winner's time is off the calendar" in caplog.text
