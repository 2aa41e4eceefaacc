"""The preference centre after a new notice: what changed, and keeping one's choices under it.
Also the topic sentences a person reads after subscribing, and the notice's own page."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from portal import db
from portal.consent import catalogue
from tests.helpers import count_rows, csrf_token, error_summary

NEW_TEXT = "We send what you choose.\nWe now send a <b>monthly</b> summary & tips."


@pytest.fixture
def chose(client, subscriptions, catalogue_ready):
    """Subscribed on the subscribe page with "offers" ticked, under notice v1."""
    response = client.post(
        "/api/push/subscribe",
        json={
            "subscription": subscriptions().to_json(),
            "topics": ["offers"],
            "policyVersion": "v1",
            "source": "subscribe-page",
        },
    )
    assert response.status_code == 201
    return client


def _publish(app, clock, version="v2", text=NEW_TEXT):
    with db.begin(app) as session:
        catalogue.publish_policy(session, version=version, text=text, now=clock.advance(days=1))


def _state(html: str, slug: str) -> str:
    found = re.search(rf'<p class="choice__state" id="topic-{slug}-state">(.*?)</p>', html, re.S)
    assert found, slug
    return found.group(1)


def _versions(engine) -> dict[str, str | None]:
    with engine.connect() as conn:
        return dict(
            conn.execute(
                sa.text(
                    "SELECT t.slug, p.policy_version FROM topic_preference p "
                    "JOIN topic t ON t.id = p.topic_id"
                )
            ).all()
        )


def test_a_topic_left_unticked_on_the_subscribe_page_is_not_called_turned_off(chose):
    html = chose.get("/preferences").text
    assert _state(html, "offers") == (
        "On: you chose this on 01 January 2026, under notice version v1."
    )
    assert _state(html, "weekly-digest") == (
        "Off: you left this unticked when you subscribed on 01 January 2026, "
        "under notice version v1."
    )
    assert "you turned" not in html
    assert " on on " not in html
    # The transactional ones were not asked: their default stands, in its own words.
    assert "On by default for account messages" in _state(html, "security-alerts")
    assert "Our notice has changed" not in html  # every choice is under the current notice


def test_after_a_new_notice_the_centre_shows_what_changed_and_offers_to_confirm(
    chose, app, clock, engine
):
    _publish(app, clock)
    html = chose.get("/preferences").text
    section = html.split('id="notice-changes"', 1)[1].split("</section>", 1)[0]
    assert "Our notice has changed" in section
    assert "Changes from notice version v1 to version v2" in section
    # The new line, escaped: the notice's text is text, never markup.
    assert "<ins>We now send a &lt;b&gt;monthly&lt;/b&gt; summary &amp; tips.</ins>" in section
    assert "<b>monthly</b>" not in html
    assert 'href="/policy/v2"' in section and 'href="/policy/v1"' in section
    assert 'action="/preferences/confirm-notice"' in section
    assert 'name="policy_version" value="v2"' in section

    before = count_rows(engine, "consent_event")
    confirmed = chose.post(
        "/preferences/confirm-notice",
        data={"csrf_token": csrf_token(html), "policy_version": "v2"},
    )
    assert confirmed.status_code == 303
    assert confirmed.headers["Location"].endswith("/preferences")
    # Each of the person's choices (offers on, weekly-digest left unticked) is recorded
    # again, unchanged, under v2; nothing else moves.
    assert _versions(engine) == {"offers": "v2", "weekly-digest": "v2"}
    assert count_rows(engine, "consent_event") == before + 2
    with engine.connect() as conn:
        events = conn.execute(
            sa.text(
                "SELECT previous_state, new_state, policy_version, source FROM consent_event "
                "ORDER BY seq DESC LIMIT 2"
            )
        ).all()
    assert all(e.previous_state == e.new_state for e in events)
    assert {e.policy_version for e in events} == {"v2"}
    assert {e.source for e in events} == {"preference-centre"}

    after = chose.get("/preferences").text
    assert "Your choices are kept under notice version v2." in after
    assert "Our notice has changed" not in after
    assert "On: you chose this on 02 January 2026, under notice version v2." in after
    # Kept off by confirming: a "no" the person gave, never "turned off".
    assert _state(after, "weekly-digest") == (
        "Off: you said no to this on 02 January 2026, under notice version v2."
    )

    # Confirming twice records nothing more.
    again = chose.post(
        "/preferences/confirm-notice",
        data={"csrf_token": csrf_token(after), "policy_version": "v2"},
    )
    assert again.status_code == 303
    assert count_rows(engine, "consent_event") == before + 2


@pytest.mark.parametrize(
    ("version", "status"),
    [("v1", 409), ("", 400), ("no-such-notice", 400), ("x" * 500, 400)],
)
def test_confirming_anything_but_the_current_notice_changes_nothing(
    chose, app, clock, engine, version, status
):
    _publish(app, clock)
    html = chose.get("/preferences").text
    before = (count_rows(engine, "consent_event"), _versions(engine))
    refused = chose.post(
        "/preferences/confirm-notice",
        data={"csrf_token": csrf_token(html), "policy_version": version},
    )
    assert refused.status_code == status
    assert [field for field, _ in error_summary(refused.text)] == ["notice-changes"]
    assert 'id="notice-changes"' in refused.text  # the summary's link has its target
    assert (count_rows(engine, "consent_event"), _versions(engine)) == before


def test_confirming_needs_the_page_and_a_person(chose, app, clock, engine):
    _publish(app, clock)
    before = count_rows(engine, "consent_event")
    assert (
        chose.post("/preferences/confirm-notice", data={"policy_version": "v2"}).status_code == 400
    )
    html = chose.get("/preferences").text
    chose.delete_cookie("portal_subscriber")  # the page's token, but no longer a person
    answer = chose.post(
        "/preferences/confirm-notice",
        data={"csrf_token": csrf_token(html), "policy_version": "v2"},
    )
    assert answer.status_code == 403
    assert count_rows(engine, "consent_event") == before


def test_a_save_opened_under_the_old_notice_shows_what_changed(chose, app, clock, engine):
    html = chose.get("/preferences").text
    _publish(app, clock)
    before = (count_rows(engine, "consent_event"), _versions(engine))
    stale = chose.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(html),
            "policy_version": "v1",
            "visible": ["offers", "weekly-digest"],
            "topics": ["offers", "weekly-digest"],
        },
    )
    assert stale.status_code == 409
    assert "What changed since you opened this page" in stale.text
    assert "<ins>We now send a &lt;b&gt;monthly&lt;/b&gt; summary &amp; tips.</ins>" in stale.text
    assert 'id="policy-ack"' in stale.text  # the confirm that saves them under v2
    assert 'name="policy_version" value="v2"' in stale.text
    assert "Our notice has changed" not in stale.text  # one summary, beside the form's confirm
    assert (count_rows(engine, "consent_event"), _versions(engine)) == before


def test_the_notice_page_leads_with_the_text_and_keeps_the_digest_in_details(
    client, catalogue_ready
):
    html = client.get("/policy/v1").text
    main = html.split("<main", 1)[1]
    assert main.index("We send what you choose.") < main.index("<details")
    details = main.split("<details", 1)[1].split("</details>", 1)[0]
    assert "<summary>" in details
    assert catalogue.text_digest("We send what you choose.") in details
    assert main.count(catalogue.text_digest("We send what you choose.")) == 1


def test_the_summary_is_not_offered_for_choices_without_a_notice(client, subscribed, app, clock):
    """A person with no choices has agreed to nothing: there is nothing to confirm."""
    _publish(app, clock)
    assert "Our notice has changed" not in client.get("/preferences").text
