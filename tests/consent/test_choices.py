"""The one rule for a choice of topics (``chosen_topics``), and both routes that take a
choice — the subscribe call's ``topics`` and the preferences call's ``decisions`` —
refusing the same bad choice with the same answer."""

from __future__ import annotations

import pytest

from portal.consent.preferences import Choice, chosen_topics
from portal.db import db
from portal.errors import ValidationError
from tests.helpers import count_rows


def test_the_rule_answers_every_active_topic(app, catalogue_ready):
    with app.app_context():
        topics = chosen_topics(
            db.session, policy_version="v1", choices=[Choice("offers", "topics[0]")]
        )
    assert set(topics) == {"security-alerts", "order-updates", "weekly-digest", "offers"}


@pytest.mark.parametrize(
    ("version", "slugs", "repeat_field", "code", "field"),
    [
        ("v9", ["offers"], None, "unknown_policy_version", "policyVersion"),
        ("v1", ["offers", "nope"], None, "unknown_topic", "f1"),
        ("v1", ["offers", "offers"], None, "duplicate_topic", "f1"),
        ("v1", ["offers", "offers"], "topics", "duplicate_topic", "topics"),
        ("v1", ["order-updates"], None, "unknown_topic", "f0"),  # retired below
    ],
)
def test_the_rule_refuses(app, catalogue_ready, version, slugs, repeat_field, code, field):
    app.test_cli_runner().invoke(args=["portal", "topic", "retire", "order-updates"])
    with app.app_context(), pytest.raises(ValidationError) as refused:
        chosen_topics(
            db.session,
            policy_version=version,
            choices=[Choice(slug, f"f{i}") for i, slug in enumerate(slugs)],
            repeat_field=repeat_field,
        )
    assert (refused.value.code, refused.value.field) == (code, field)


@pytest.mark.parametrize(
    ("version", "slug", "code"),
    [("v9", "offers", "unknown_policy_version"), ("v1", "order-updates", "unknown_topic")],
)
def test_both_routes_refuse_a_bad_choice_alike(
    app, client, engine, subscriptions, subscribed, version, slug, code
):
    app.test_cli_runner().invoke(args=["portal", "topic", "retire", "order-updates"])
    events = count_rows(engine, "consent_event")
    at_subscribe = client.post(
        "/api/push/subscribe",
        json={
            "subscription": subscriptions().to_json(),
            "topics": [slug],
            "policyVersion": version,
        },
    )
    at_preferences = client.post(
        "/api/push/preferences",
        json={
            "endpoint": subscribed.endpoint,
            "decisions": [{"slug": slug, "state": "opt_in"}],
            "policyVersion": version,
            "decidedAt": "2025-12-31T23:00:00Z",
        },
    )
    answers = [at_subscribe.get_json()["error"], at_preferences.get_json()["error"]]
    assert {a["code"] for a in answers} == {code}
    assert len({a["message"] for a in answers}) == 1  # the same words: the same rule
    assert at_subscribe.status_code == at_preferences.status_code == 422
    assert count_rows(engine, "consent_event") == events  # nothing written by either
