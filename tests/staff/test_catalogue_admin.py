"""Admin pages for topics and policy versions: every change audited, nothing deleted."""

from __future__ import annotations

import json
import re

import pytest
import sqlalchemy as sa

from portal.consent import catalogue
from portal.consent.catalogue import text_digest
from portal.consent.models import PolicyVersion, Topic
from portal.db import db
from portal.staff.catalogue import line_diff
from tests.helpers import all_rows, count_rows


def _audit(engine, action):
    rows = [r for r in all_rows(engine, "staff_audit") if r["action"] == action]
    for row in rows:
        if isinstance(row["detail"], str):
            row["detail"] = json.loads(row["detail"])
    return rows


def _topic(app, slug) -> Topic:
    with app.app_context():
        return db.session.scalars(sa.select(Topic).where(Topic.slug == slug)).one()


NEW_TOPIC = {
    "slug": "product-news",
    "category": "News",
    "label": "Product news",
    "description": "New features, once a month.",
    "topic_class": "marketing",
    "default_state": "opt_out",
}


def test_an_admin_adds_a_topic_and_it_is_audited(app, engine, admin_browser):
    response = admin_browser.post("/staff/admin/topics/new", NEW_TOPIC)
    assert response.status_code == 303
    page = admin_browser.get(response.location).text
    assert "Topic product-news added." in page
    assert "<caption>News</caption>" in page
    topic = _topic(app, "product-news")
    assert (topic.label, topic.is_transactional, topic.default_state) == (
        "Product news",
        False,
        "opt_out",
    )
    (row,) = _audit(engine, "topic.created")
    assert row["actor_email"] == "admin@example.test"
    assert row["target"] == "topic:product-news"
    assert row["detail"] == {
        "category": "News",
        "label": "Product news",
        "class": "marketing",
        "default": "opt_out",
    }


def test_the_new_topic_form_names_every_problem(app, engine, admin_browser):
    response = admin_browser.post(
        "/staff/admin/topics/new", {"slug": "Not A Slug", "category": "", "label": "x" * 121}
    )
    assert response.status_code == 422
    links = re.findall(r'<li><a href="#([\w-]+)">([^<]+)</a></li>', response.text)
    assert links == [
        ("slug", "Use lowercase letters and digits, words joined by hyphens"),
        ("category", "Enter a category"),
        ("label", "The label is at most 120 characters"),
        ("topic_class", "Choose whether the topic is marketing or transactional"),
        ("default_state", "Choose a default"),
    ]
    assert 'id="topic_class" name="topic_class" value="marketing"' in response.text
    assert "<legend>Class</legend>" in response.text
    assert "<title>Error: Add a topic" in response.text
    assert count_rows(engine, "topic") == 0
    assert _audit(engine, "topic.created") == []


def test_a_slug_is_never_reused(app, engine, admin_browser, catalogue_ready):
    response = admin_browser.post("/staff/admin/topics/new", {**NEW_TOPIC, "slug": "offers"})
    assert response.status_code == 422
    assert "exists already (slugs are never reused)" in response.text
    assert count_rows(engine, "topic") == 4


def test_editing_changes_only_the_wording(app, engine, admin_browser, catalogue_ready):
    page = admin_browser.get("/staff/admin/topics/offers/edit").text
    assert "cannot change" in page
    assert "<dt>Slug</dt><dd><code>offers</code></dd>" in page
    response = admin_browser.post(
        "/staff/admin/topics/offers/edit",
        {
            "label": "Special offers",
            "description": "About offers.",
            # Fields the page does not offer are ignored, whatever is posted.
            "slug": "hijacked",
            "default_state": "opt_in",
            "topic_class": "transactional",
        },
    )
    assert response.status_code == 303
    topic = _topic(app, "offers")
    assert topic.label == "Special offers"
    assert (topic.default_state, topic.is_transactional) == ("opt_out", False)
    (row,) = _audit(engine, "topic.edited")
    assert row["target"] == "topic:offers"
    assert row["detail"] == {"label": {"from": "Offers", "to": "Special offers"}}


def test_saving_unchanged_wording_writes_no_audit_row(app, engine, admin_browser, catalogue_ready):
    response = admin_browser.post(
        "/staff/admin/topics/offers/edit", {"label": "Offers", "description": "About offers."}
    )
    assert response.status_code == 303
    assert "Nothing changed on topic offers." in admin_browser.get(response.location).text
    assert _audit(engine, "topic.edited") == []


def test_an_empty_label_is_refused(app, engine, admin_browser, catalogue_ready):
    response = admin_browser.post("/staff/admin/topics/offers/edit", {"label": " "})
    assert response.status_code == 422
    assert '<a href="#label">Enter a label</a>' in response.text
    assert _topic(app, "offers").label == "Offers"


def _seed_history(app, clock):
    """A subscriber who opted into offers: a preference row and a consent event."""
    from portal.consent.models import PreferenceState
    from portal.consent.preferences import Decision, apply_decisions
    from portal.subscriptions.models import Subscriber

    with db.begin(app) as session:
        person = Subscriber(created_at=clock.now(), region_code="US")
        session.add(person)
        session.flush()
        apply_decisions(
            session,
            person.id,
            [Decision(catalogue.topic_by_slug(session, "offers"), PreferenceState.OPT_IN)],
            source="preference-centre",
            policy_version="v1",
            decided_at=clock.now(),
            recorded_at=clock.now(),
        )


def test_retiring_asks_first_then_keeps_everything(
    app, engine, clock, admin_browser, catalogue_ready
):
    _seed_history(app, clock)
    counts = {t: count_rows(engine, t) for t in ("topic", "topic_preference", "consent_event")}
    confirm = admin_browser.get("/staff/admin/topics/offers/retire")
    assert confirm.status_code == 200
    assert "nothing is deleted" in confirm.text
    assert _topic(app, "offers").retired_at is None  # the GET changed nothing

    response = admin_browser.post("/staff/admin/topics/offers/retire")
    assert response.status_code == 303
    assert _topic(app, "offers").retired_at == clock.now()
    assert {t: count_rows(engine, t) for t in counts} == counts
    (row,) = _audit(engine, "topic.retired")
    assert row["target"] == "topic:offers"

    again = admin_browser.post("/staff/admin/topics/offers/retire")
    assert "was already retired" in admin_browser.get(again.location).text
    assert len(_audit(engine, "topic.retired")) == 1
    listing = admin_browser.get("/staff/admin/topics").text
    assert "Retired 2026-01-01 00:00:00 UTC" in listing


def test_a_retired_topic_cannot_be_edited(app, engine, admin_browser, catalogue_ready, clock):
    with db.begin(app) as session:
        catalogue.retire_topic(session, "offers", now=clock.now())
    response = admin_browser.post("/staff/admin/topics/offers/edit", {"label": "Changed"})
    assert response.status_code == 409
    assert "its wording stays as it was" in response.text
    assert _topic(app, "offers").label == "Offers"


def test_retiring_needs_a_csrf_token(app, admin_browser, catalogue_ready):
    response = admin_browser.client.post("/staff/admin/topics/offers/retire", data={})
    assert response.status_code == 400
    assert _topic(app, "offers").retired_at is None


def test_unknown_topics_are_404(app, admin_browser):
    assert admin_browser.get("/staff/admin/topics/nope/edit").status_code == 404
    assert admin_browser.post("/staff/admin/topics/nope/retire").status_code == 404


# -- policy versions ------------------------------------------------------------------------

V1 = "We send what you choose.\nYou can change your mind.\nWe never sell your data.\n"
V2 = "We send what you choose.\nYou can change your mind at any time.\nWe never sell your data.\n"


def _publish_v1(app, clock):
    with db.begin(app) as session:
        catalogue.publish_policy(session, version="v1", text=V1, now=clock.now())


def test_preview_shows_the_text_and_a_diff_and_publishes_nothing(app, engine, clock, admin_browser):
    _publish_v1(app, clock)
    response = admin_browser.post(
        "/staff/admin/policies/new", {"version": "v2", "text": V2, "action": "preview"}
    )
    assert response.status_code == 200
    html = response.text
    assert "Preview of version v2" in html
    assert f'name="previewed" value="{text_digest(V2)}"' in html
    assert "1 line added" in html and "1 line removed" in html
    # Words and signs, not colour alone.
    assert '<span aria-hidden="true">+ </span>Added' in html
    assert '<span aria-hidden="true">− </span>Removed' in html
    assert "<del>You can change your mind.</del>" in html
    assert "<ins>You can change your mind at any time.</ins>" in html
    assert "Publish version v2" in html
    assert count_rows(engine, "policy_version") == 1
    assert _audit(engine, "policy.published") == []


def test_publishing_the_previewed_text_is_audited(app, engine, clock, admin_browser):
    _publish_v1(app, clock)
    clock.advance(minutes=1)
    # Browsers send textarea line breaks as CRLF: the stored text has LF, as previewed.
    crlf = V2.replace("\n", "\r\n")
    response = admin_browser.post(
        "/staff/admin/policies/new",
        {"version": "v2", "text": crlf, "action": "publish", "previewed": text_digest(V2)},
    )
    assert response.status_code == 303
    assert response.location.endswith("/staff/admin/policies/versions/v2")
    with app.app_context():
        stored = db.session.get(PolicyVersion, "v2")
        assert stored.text == V2
        assert catalogue.current_policy(db.session).version == "v2"
    (row,) = _audit(engine, "policy.published")
    assert row["target"] == "policy:v2"
    assert row["detail"] == {
        "sha256": text_digest(V2),
        "previous": "v1",
        "lines_added": 1,
        "lines_removed": 1,
    }
    page = admin_browser.get(response.location).text
    assert "Policy version v2 is published." in page
    assert "Changes from version v1 to v2" in page
    assert "Current: every consent form shows it" in page


@pytest.mark.parametrize(
    ("previewed", "message"),
    [
        ("", "Preview the text before publishing it"),
        (text_digest(V1), "The text changed since the preview"),
    ],
)
def test_publishing_needs_the_text_that_was_previewed(
    app, engine, clock, admin_browser, previewed, message
):
    _publish_v1(app, clock)
    response = admin_browser.post(
        "/staff/admin/policies/new",
        {"version": "v2", "text": V2, "action": "publish", "previewed": previewed},
    )
    assert response.status_code == 422
    assert message in response.text
    assert "Preview of version v2" in response.text  # the preview to read now
    assert count_rows(engine, "policy_version") == 1


def test_a_published_version_is_never_replaced(app, engine, clock, admin_browser):
    _publish_v1(app, clock)
    response = admin_browser.post(
        "/staff/admin/policies/new",
        {"version": "v1", "text": V2, "action": "publish", "previewed": text_digest(V2)},
    )
    assert response.status_code == 422
    assert "published already" in response.text
    with app.app_context():
        assert db.session.get(PolicyVersion, "v1").text == V1
    preview = admin_browser.post(
        "/staff/admin/policies/new", {"version": "v1", "text": V2, "action": "preview"}
    )
    assert preview.status_code == 422
    assert "Version v1 is published already" in preview.text


def test_the_first_version_has_no_diff(app, engine, clock, admin_browser):
    preview = admin_browser.post(
        "/staff/admin/policies/new", {"version": "v1", "text": V1, "action": "preview"}
    )
    assert "There is no current version: this will be the first." in preview.text
    published = admin_browser.post(
        "/staff/admin/policies/new",
        {"version": "v1", "text": V1, "action": "publish", "previewed": text_digest(V1)},
    )
    assert published.status_code == 303
    page = admin_browser.get("/staff/admin/policies/versions/v1").text
    assert "This is the first published version." in page
    assert 'href="/policy/v1"' in page
    (row,) = _audit(engine, "policy.published")
    assert row["detail"] == {"sha256": text_digest(V1), "previous": None}


def test_the_policy_list_and_any_version(app, clock, admin_browser):
    _publish_v1(app, clock)
    clock.advance(minutes=1)
    with db.begin(app) as session:
        catalogue.publish_policy(session, version="v2", text=V2, now=clock.now())
    listing = admin_browser.get("/staff/admin/policies").text
    assert listing.index(">v2</a>") < listing.index(">v1</a>")
    older = admin_browser.get("/staff/admin/policies/versions/v1").text
    assert "Earlier version" in older
    assert "We never sell your data." in older
    assert admin_browser.get("/staff/admin/policies/versions/v9").status_code == 404


def test_an_empty_text_is_refused(app, engine, admin_browser):
    response = admin_browser.post(
        "/staff/admin/policies/new", {"version": "v1", "text": "  \r\n ", "action": "preview"}
    )
    assert response.status_code == 422
    assert '<a href="#text">Enter the notice text</a>' in response.text


def test_line_diff_hunks_and_counts():
    old = "\n".join(f"line {i}" for i in range(1, 21))
    new = old.replace("line 2\n", "").replace("line 18", "line eighteen")
    diff = line_diff(old, new, context=1)
    assert (diff.added, diff.removed) == (1, 2)
    first, second = diff.hunks
    assert first.skipped_before == 0
    assert [(d.kind, d.old_number, d.new_number) for d in first.lines] == [
        ("same", 1, 1),
        ("removed", 2, None),
        ("same", 3, 2),
    ]
    assert second.skipped_before == 13  # lines 4–16
    assert [d.kind for d in second.lines] == ["same", "removed", "added", "same"]
    assert diff.skipped_after == 1  # line 20
    assert not line_diff("same\n", "same\n").changed
