"""end_subscriptions: the one place a subscription ends and its consent event is written
(the dispatcher, delivery feedback, unsubscribing and the retention sweep all use it)."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from portal.consent.models import EventKind
from portal.db import db
from portal.subscriptions.models import EndReason, PushSubscription, SubscriptionState
from portal.subscriptions.services import Ending, end_subscriptions, ending
from tests.helpers import all_rows

SUBSCRIBE = "/api/push/subscribe"


def _subscribed(client, engine, subscriptions, count: int) -> list[dict]:
    made = [subscriptions() for _ in range(count)]
    for sub in made:
        assert client.post(SUBSCRIBE, json={"subscription": sub.to_json()}).status_code in (
            200,
            201,
        )
    rows = {r["endpoint"]: r for r in all_rows(engine, "push_subscription")}
    return [rows[sub.endpoint] for sub in made]


def _id(value) -> uuid.UUID | None:
    """A uuid column as read raw (hex text on SQLite, a UUID on PostgreSQL)."""
    return None if value is None else uuid.UUID(str(value))


def _events(engine) -> list[dict]:
    return [e for e in all_rows(engine, "consent_event") if e["kind"] == EventKind.EXPIRED.value]


def test_only_subscriptions_in_the_given_states_end_and_each_is_logged_once(
    app, client, engine, subscriptions, clock
):
    live, stale, gone = _subscribed(client, engine, subscriptions, 3)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE push_subscription SET state = 'stale' WHERE id = :id"),
            {"id": stale["id"]},
        )
        conn.execute(
            sa.text(
                "UPDATE push_subscription SET state = 'revoked', end_reason = 'unsubscribed' WHERE id = :id"
            ),
            {"id": gone["id"]},
        )
    before = len(_events(engine))
    now = clock.now()
    with app.app_context():
        ended = end_subscriptions(
            db.session,
            [
                Ending(_id(row["id"]), _id(row["subscriber_id"]), state)
                for row, state in ((live, "pending"), (stale, "stale"), (gone, "revoked"))
            ],
            state=SubscriptionState.EXPIRED,
            reason=EndReason.EXPIRED,
            from_states=(
                SubscriptionState.PENDING,
                SubscriptionState.ACTIVE,
                SubscriptionState.STALE,
            ),
            now=now,
            event=EventKind.EXPIRED,
        )
        db.session.commit()
    assert ended == {_id(live["id"]), _id(stale["id"])}
    rows = {_id(r["id"]): r for r in all_rows(engine, "push_subscription")}
    for row in (live, stale):
        assert (rows[_id(row["id"])]["state"], rows[_id(row["id"])]["end_reason"]) == (
            "expired",
            "expired",
        )
        assert rows[_id(row["id"])]["revoked_at"] is None  # expired, not revoked
    assert (rows[_id(gone["id"])]["state"], rows[_id(gone["id"])]["end_reason"]) == (
        "revoked",
        "unsubscribed",
    )
    logged = _events(engine)[before:]
    with_subscriber = [r for r in (live, stale) if r["subscriber_id"] is not None]
    assert sorted(str(e["subscription_id"]) for e in logged) == sorted(
        str(r["id"]) for r in with_subscriber
    )
    assert {e["previous_state"] for e in logged} <= {"pending", "stale"}


def test_a_subscription_already_ended_the_same_way_is_left_alone(
    app, client, engine, subscriptions, clock
):
    (row,) = _subscribed(client, engine, subscriptions, 1)
    with app.app_context():
        sub = db.session.get(PushSubscription, _id(row["id"]))
        assert sub is not None
        kwargs = {
            "state": SubscriptionState.REVOKED,
            "reason": EndReason.UNSUBSCRIBED,
            "from_states": tuple(SubscriptionState),
            "event": None,
        }
        first = end_subscriptions(db.session, [ending(sub)], now=clock.now(), **kwargs)
        # The object in the session sees the change, revoked_at included.
        assert (sub.state, sub.end_reason, sub.revoked_at) == (
            SubscriptionState.REVOKED,
            "unsubscribed",
            clock.now(),
        )
        clock.advance(minutes=5)
        again = end_subscriptions(db.session, [ending(sub)], now=clock.now(), **kwargs)
        db.session.commit()
    assert first == {sub.id} and again == set()
    (stored,) = all_rows(engine, "push_subscription")
    assert stored["state"] == "revoked"


def test_nothing_to_end_writes_nothing(app, engine):
    with app.app_context():
        assert (
            end_subscriptions(
                db.session,
                [],
                state=SubscriptionState.REVOKED,
                reason=EndReason.UNSUBSCRIBED,
                from_states=tuple(SubscriptionState),
                now=None,  # type: ignore[arg-type]
                event=EventKind.UNSUBSCRIBED,
            )
            == set()
        )
    assert all_rows(engine, "consent_event") == []
