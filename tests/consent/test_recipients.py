"""The recipient query: the region matrix, justifications, and agreement with the pages."""

from __future__ import annotations

import itertools
import uuid

import pytest
import sqlalchemy as sa

from portal.consent import catalogue
from portal.consent.models import PreferenceState, Topic
from portal.consent.preferences import Decision, Reason, apply_decisions, effective_state
from portal.consent.recipients import audience_breakdown, recipients
from portal.db import db
from portal.subscriptions.models import PushSubscription, Subscriber
from tests.factories import SubscriptionFactory
from tests.helpers import count_rows

REGIONS = ["EU", "UK", "CA", "US"]
# Beyond the matrix: another unrestricted region, and an unknown one (NULL in SQL), which
# gets no marketing default.
MORE_REGIONS = ["BR", None]
CLASSES = [True, False]  # transactional?
DEFAULTS = ["opt_in", "opt_out"]
DECISIONS = ["opt_in", "opt_out", "unset"]


def _expected(region, transactional, default, decision):
    if decision == "opt_in":
        return Reason.EXPLICIT_OPT_IN
    if decision == "opt_out" or default == "opt_out":
        return None
    if transactional:
        return Reason.TRANSACTIONAL_GRANT
    return Reason.DEFAULT_BY_REGION if region in ("US", "BR") else None


def test_region_matrix(app, client, clock):
    """{EU, UK, CA, US} × {transactional, marketing} × {default in, out} × {in, out, unset}."""
    factory = SubscriptionFactory()
    topics = {}
    with db.begin(app) as session:
        catalogue.publish_policy(session, version="v1", text="Notice.", now=clock.now())
        for transactional, default in itertools.product(CLASSES, DEFAULTS):
            slug = f"{'tx' if transactional else 'mkt'}-{default.replace('_', '-')}"
            topics[(transactional, default)] = catalogue.add_topic(
                session,
                slug=slug,
                category="c",
                label=slug,
                transactional=transactional,
                default_state=default,
                now=clock.now(),
            ).id
    # One subscriber (with one live subscription) per region × decision; the decision
    # applies to every topic, so each topic sees every combination.
    people = {}
    for region, decision in itertools.product(REGIONS + MORE_REGIONS, DECISIONS):
        browser = app.test_client()
        answer = browser.post("/api/push/subscribe", json={"subscription": factory().to_json()})
        assert answer.status_code == 201
        with db.begin(app) as session:
            subscription = session.get(PushSubscription, uuid.UUID(answer.json["id"]))
            subscriber = session.get(Subscriber, subscription.subscriber_id)
            subscriber.region_code = region
            if decision != "unset":
                all_topics = {t.id: t for t in catalogue.active_topics(session)}
                apply_decisions(
                    session,
                    subscriber.id,
                    [
                        Decision(all_topics[tid], PreferenceState(decision))
                        for tid in topics.values()
                    ],
                    source="api",
                    policy_version="v1",
                    decided_at=clock.now(),
                    recorded_at=clock.now(),
                )
            people[(region, decision)] = (str(subscriber.id), answer.json["id"])

    checked = 0
    for (transactional, default), topic_id in topics.items():
        with db.begin(app) as session:
            found = {str(r.subscription_id): r for r in recipients(session, topic_id, batch=3)}
            topic = session.get(Topic, topic_id)
            breakdown = audience_breakdown(session, topic_id)
            for (region, decision), (subscriber_id, subscription_id) in people.items():
                expected = _expected(region, transactional, default, decision)
                got = found.get(subscription_id)
                assert (got.reason if got else None) == expected, (
                    region,
                    transactional,
                    default,
                    decision,
                )
                # The page's rule says the same thing as the query.
                page = effective_state(None if decision == "unset" else decision, topic, region)
                assert page.on == (expected is not None)
                if got is not None:
                    assert str(got.subscriber_id) == subscriber_id
                    if expected == Reason.DEFAULT_BY_REGION:
                        assert got.event_seq is None  # the rule is the justification
                    else:
                        kind, new_state = session.execute(
                            sa.text("SELECT kind, new_state FROM consent_event WHERE seq = :s"),
                            {"s": got.event_seq},
                        ).one()
                        assert (kind, new_state) == (
                            ("preference_changed", "opt_in")
                            if expected == Reason.EXPLICIT_OPT_IN
                            else ("permission_granted", "granted")
                        )
                checked += 1
            # Exactly the expected subscriptions: nobody else, nobody twice.
            assert set(found) == {
                subscription_id
                for (region, decision), (_, subscription_id) in people.items()
                if _expected(region, transactional, default, decision) is not None
            }
            assert sum(breakdown.values()) == len(found)
    assert checked == (4 + 2) * 2 * 2 * 3


def test_dead_subscriptions_and_erased_subscribers_get_nothing(
    app, client, clock, subscriptions, catalogue_ready, engine
):
    subs = [subscriptions() for _ in range(4)]
    for sub in subs:
        app.test_client().post("/api/push/subscribe", json={"subscription": sub.to_json()})
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE push_subscription SET state = 'stale' WHERE endpoint = :e"),
            {"e": subs[0].endpoint},
        )
        conn.execute(
            sa.text("UPDATE push_subscription SET state = 'revoked' WHERE endpoint = :e"),
            {"e": subs[1].endpoint},
        )
        conn.execute(
            sa.text(
                "UPDATE subscriber SET erased_at = :t WHERE id = (SELECT subscriber_id FROM push_subscription WHERE endpoint = :e)"
            ),
            {"t": clock.now(), "e": subs[2].endpoint},
        )
    with db.begin(app) as session:
        security = catalogue.topic_by_slug(session, "security-alerts")
        found = list(recipients(session, security.id))
    assert len(found) == 1
    assert found[0].reason == Reason.TRANSACTIONAL_GRANT


def test_retiring_a_topic_keeps_history_and_leaves_page_and_audience(
    app, client, clock, subscribed, engine
):
    from tests.helpers import csrf_token

    page = client.get("/preferences")
    assert 'id="topic-offers"' in page.text
    assert 'id="topic-offers"' in client.get("/").text
    client.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(page.text),
            "policy_version": "v1",
            "visible": ["offers", "weekly-digest"],
            "topics": ["offers"],
        },
    )
    with db.begin(app) as session:
        offers = catalogue.topic_by_slug(session, "offers")
        assert [r.reason for r in recipients(session, offers.id)] == [Reason.EXPLICIT_OPT_IN]
    events_before = count_rows(engine, "consent_event")
    preferences_before = count_rows(engine, "topic_preference")
    result = app.test_cli_runner().invoke(args=["portal", "topic", "retire", "offers"])
    assert result.exit_code == 0, result.output
    with engine.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT count(*) FROM consent_event")).scalar_one()
            == events_before
        )
        assert (
            conn.execute(
                sa.text(
                    "SELECT state FROM topic_preference p JOIN topic t ON t.id = p.topic_id WHERE t.slug = 'offers'"
                )
            ).scalar_one()
            == "opt_in"
        )
    assert count_rows(engine, "topic_preference") == preferences_before
    assert count_rows(engine, "topic") == 4
    assert "topic-offers" not in client.get("/preferences").text
    assert "topic-offers" not in client.get("/").text  # nor offered at subscription
    with db.begin(app) as session:
        offers = catalogue.topic_by_slug(session, "offers")
        assert list(recipients(session, offers.id)) == []
    listing = app.test_cli_runner().invoke(args=["portal", "topic", "list"]).output
    assert "offers" in listing
    assert "retired" in listing


@pytest.mark.parametrize(
    ("region", "on"), [("EU", False), ("UK", False), ("CA", False), ("US", True), (None, False)]
)
def test_marketing_default_by_region(region, on):
    class T:
        default_state = "opt_in"
        is_transactional = False

    assert effective_state(None, T, region).on is on


@pytest.mark.postgres_only
def test_recipients_stream_through_a_server_side_cursor(app, subscriptions, catalogue_ready):
    """The audience is fetched batch by batch from a cursor the server holds open."""
    for _ in range(5):
        answer = app.test_client().post(
            "/api/push/subscribe", json={"subscription": subscriptions().to_json()}
        )
        assert answer.status_code == 201
    with db.begin(app) as session:
        security = catalogue.topic_by_slug(session, "security-alerts")
        stream = recipients(session, security.id, batch=2)
        first = next(stream)
        # While the first batch is being read, the rest waits in a cursor the server
        # holds open for this transaction.
        open_cursors = session.execute(
            sa.text("SELECT count(*) FROM pg_cursors WHERE NOT is_holdable")
        ).scalar_one()
        rest = list(stream)
    assert open_cursors == 1
    assert first.reason == Reason.TRANSACTIONAL_GRANT
    assert len(rest) == 4
