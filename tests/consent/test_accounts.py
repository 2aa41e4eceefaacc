"""Linking a browser to an account: the newer decision on each topic wins, nothing is lost."""

from __future__ import annotations

import sqlalchemy as sa

from portal.consent import catalogue
from portal.consent.accounts import link_account
from portal.consent.models import PreferenceState, Topic, TopicPreference
from portal.consent.preferences import Decision, apply_decisions
from portal.consent.tree import verify_chain
from portal.db import db, uuid7
from portal.identity import Assertion
from portal.subscriptions.models import Subscriber


def _subscriber(session, clock, external_user_id=None):
    subscriber = Subscriber(id=uuid7(), external_user_id=external_user_id, created_at=clock.now())
    session.add(subscriber)
    session.flush()
    return subscriber.id


def _decide(session, clock, subscriber_id, slug, state):
    topic = catalogue.topic_by_slug(session, slug)
    apply_decisions(
        session,
        subscriber_id,
        [Decision(topic, PreferenceState(state))],
        source="preference-centre",
        policy_version="v1",
        decided_at=clock.now(),
        recorded_at=clock.now(),
    )


def _states(conn, subscriber_id):
    return dict(
        conn.execute(
            sa.select(Topic.slug, TopicPreference.state)
            .join(Topic, Topic.id == TopicPreference.topic_id)
            .where(TopicPreference.subscriber_id == subscriber_id)
        ).all()
    )


def test_linking_merges_the_browsers_decisions_where_they_are_newer(catalogue_ready, engine, clock):
    app = catalogue_ready
    with db.begin(app) as session:
        account = _subscriber(session, clock, "user-7")
        browser = _subscriber(session, clock)
        _decide(session, clock, account, "weekly-digest", "opt_out")  # older than the browser's
        clock.advance(minutes=1)
        _decide(session, clock, browser, "offers", "opt_in")  # older than the account's
        _decide(session, clock, browser, "weekly-digest", "opt_in")
        _decide(session, clock, browser, "security-alerts", "opt_out")  # account never decided
        clock.advance(minutes=1)
        _decide(session, clock, account, "offers", "opt_out")
    with engine.connect() as conn:
        browser_before = _states(conn, browser)
        events_before = conn.execute(sa.text("SELECT count(*) FROM consent_event")).scalar_one()

    clock.advance(minutes=1)
    with db.begin(app) as session:
        linked = link_account(
            session,
            Assertion("user-7", None, None),
            browser_subscriber_id=browser,
            now=clock.now(),
        )
        assert linked.id == account

    with engine.connect() as conn:
        assert _states(conn, account) == {
            "offers": "opt_out",  # the account decided later: kept
            "weekly-digest": "opt_in",  # the browser decided later: carried over
            "security-alerts": "opt_out",  # only the browser decided: carried over
        }
        assert _states(conn, browser) == browser_before  # the browser's own rows stay
        new_events = conn.execute(
            sa.text(
                "SELECT kind, source, previous_state, new_state FROM consent_event "
                "WHERE seq > :n ORDER BY seq"
            ),
            {"n": events_before},
        ).all()
        assert sorted(tuple(e) for e in new_events[:-1]) == [
            ("preference_changed", "account-link", "opt_out", "opt_in"),
            ("preference_changed", "account-link", "unset", "opt_out"),
        ]
        assert tuple(new_events[-1]) == ("account_linked", "account-link", None, None)
        assert verify_chain(conn).ok
