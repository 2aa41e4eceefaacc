"""Admin pages for topics and policy versions: every change audited, nothing deleted."""

from __future__ import annotations

import json
import re
from html import unescape

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
    "category": "",  # the "A new category" radio
    "new_category": "News",
    "label": "Product news",
    "description": "New features, once a month.",
    "topic_class": "marketing",
    "default_state": "opt_out",
}
# Under a category the test catalogue has.
UNDER_NEWS = {**NEW_TOPIC, "category": "News", "new_category": ""}


def _hidden(html: str) -> dict[str, str]:
    """The hidden fields of the review's form, as a browser would send them back."""
    return {
        name: unescape(value)
        for name, value in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', html)
        if name != "csrf_token"
    }


def test_an_admin_adds_a_topic_and_it_is_audited(app, engine, admin_browser):
    response = admin_browser.post("/staff/admin/topics/new", {**NEW_TOPIC, "action": "create"})
    assert response.status_code == 303
    page = admin_browser.get(response.location).text
    assert "Topic product-news added under News." in page
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


def test_the_review_shows_what_cannot_change_and_writes_nothing(
    app, engine, admin_browser, catalogue_ready
):
    before = {t: count_rows(engine, t) for t in ("topic", "staff_audit")}
    review = admin_browser.post("/staff/admin/topics/new", UNDER_NEWS)  # action: review
    assert review.status_code == 200
    html = review.text
    assert "Check the new topic before you create it" in html
    fixed = html[html.index("Cannot change once created") : html.index("Can change later")]
    for shown in ("<code>product-news</code>", "News", "Marketing", "Off until the person"):
        assert shown in fixed
    assert fixed.count("Cannot change</strong>") == 4
    assert "A category in use: the topic joins its heading." in fixed
    later = html[html.index("Can change later") :]
    assert "Product news" in later and "New features, once a month." in later
    assert 'name="action" value="create">Create topic' in html
    assert 'name="action" value="edit" class="secondary">Go back and change' in html
    assert 'name="csrf_token"' in html
    assert {t: count_rows(engine, t) for t in before} == before
    # The review's own form creates it, and nothing else is needed.
    created = admin_browser.post("/staff/admin/topics/new", {**_hidden(html), "action": "create"})
    assert created.status_code == 303
    assert created.location.endswith("/staff/admin/topics")
    assert _topic(app, "product-news").category == "News"


def test_a_new_category_is_named_as_new_on_the_review(app, engine, admin_browser, catalogue_ready):
    review = admin_browser.post(
        "/staff/admin/topics/new", {**NEW_TOPIC, "new_category": "  Product   updates "}
    )
    assert review.status_code == 200
    assert "A new category: people will see a new heading, “Product updates”." in review.text
    created = admin_browser.post(
        "/staff/admin/topics/new", {**_hidden(review.text), "action": "create"}
    )
    assert created.status_code == 303
    assert _topic(app, "product-news").category == "Product updates"
    listing = admin_browser.get("/staff/admin/topics").text
    assert "<caption>Product updates</caption>" in listing


def test_going_back_keeps_every_value(app, engine, admin_browser, catalogue_ready):
    data = {**UNDER_NEWS, "category": "Offers", "description": "Line one.\nLine two."}
    review = admin_browser.post("/staff/admin/topics/new", data)
    back = admin_browser.post("/staff/admin/topics/new", {**_hidden(review.text), "action": "edit"})
    assert back.status_code == 200
    html = back.text
    assert 'id="slug" name="slug" type="text" value="product-news"' in html
    assert re.search(r'value="Offers"\s+checked', html)
    assert 'value="Product news"' in html
    assert ">\nLine one.\nLine two.</textarea>" in html
    assert 'id="topic_class" name="topic_class" value="marketing" checked' in html
    assert 'id="default_state" name="default_state" value="opt_out" checked' in html
    assert "There is a problem" not in html
    assert count_rows(engine, "topic") == 4


@pytest.mark.parametrize("typed", ["news", " NEWS ", "News", "ｎｅｗｓ"])
def test_a_new_category_like_one_in_use_is_refused(
    app, engine, admin_browser, catalogue_ready, typed
):
    for action in ("review", "create"):
        response = admin_browser.post(
            "/staff/admin/topics/new", {**NEW_TOPIC, "new_category": typed, "action": action}
        )
        assert response.status_code == 422
        links = re.findall(r'<li><a href="#([\w-]+)">([^<]+)</a></li>', response.text)
        ((anchor, message),) = links
        assert anchor == "new_category"
        assert message.startswith("There is a category &#34;News&#34; already: choose")
    assert count_rows(engine, "topic") == 4
    assert _audit(engine, "topic.created") == []


def test_a_category_in_use_written_differently_is_refused(
    app, engine, admin_browser, catalogue_ready
):
    response = admin_browser.post(
        "/staff/admin/topics/new", {**UNDER_NEWS, "category": "news", "action": "create"}
    )
    assert response.status_code == 422
    assert (
        "&#34;news&#34; is the category &#34;News&#34; written differently: choose &#34;News&#34;"
        in response.text
    )
    unknown = admin_browser.post(
        "/staff/admin/topics/new", {**UNDER_NEWS, "category": "Events", "action": "create"}
    )
    assert unknown.status_code == 422
    assert "There is no category &#34;Events&#34;" in unknown.text
    assert count_rows(engine, "topic") == 4


def test_the_form_lists_the_categories_in_use(app, admin_browser, catalogue_ready):
    html = admin_browser.get("/staff/admin/topics/new").text
    values = re.findall(
        r'<input type="radio" id="category[\w-]*" name="category" value="([^"]*)"', html
    )
    assert values == ["Your account", "News", "Offers", ""]
    assert '<label for="category-new">A new category</label>' in html
    assert 'id="new_category" name="new_category"' in html


def test_the_first_topic_starts_the_first_category(app, admin_browser):
    html = admin_browser.get("/staff/admin/topics/new").text
    assert '<input type="hidden" name="category" value="">' in html
    assert "There are no categories yet" in html


def test_the_new_topic_form_names_every_problem(app, engine, admin_browser, catalogue_ready):
    response = admin_browser.post(
        "/staff/admin/topics/new", {"slug": "Not A Slug", "label": "x" * 121}
    )
    assert response.status_code == 422
    links = re.findall(r'<li><a href="#([\w-]+)">([^<]+)</a></li>', response.text)
    assert links == [
        ("slug", "Use lowercase letters and digits, words joined by hyphens"),
        ("category", "Choose a category, or add a new one"),
        ("label", "The label is at most 120 characters"),
        ("topic_class", "Choose whether the topic is marketing or transactional"),
        ("default_state", "Choose a default"),
    ]
    assert 'id="topic_class" name="topic_class" value="marketing"' in response.text
    assert "<legend>Class</legend>" in response.text
    assert "<title>Error: Add a topic" in response.text
    unnamed = admin_browser.post("/staff/admin/topics/new", {**NEW_TOPIC, "new_category": "  "})
    assert unnamed.status_code == 422
    assert '<a href="#new_category">Name the new category</a>' in unnamed.text
    assert count_rows(engine, "topic") == 4
    assert _audit(engine, "topic.created") == []


def test_a_slug_is_never_reused(app, engine, admin_browser, catalogue_ready):
    for action in ("review", "create"):
        response = admin_browser.post(
            "/staff/admin/topics/new", {**UNDER_NEWS, "slug": "offers", "action": action}
        )
        assert response.status_code == 422
        assert "exists already (slugs are never reused)" in response.text
    assert count_rows(engine, "topic") == 4


def test_the_create_post_sent_again_creates_nothing(app, engine, admin_browser, catalogue_ready):
    first = admin_browser.post("/staff/admin/topics/new", {**UNDER_NEWS, "action": "create"})
    assert first.status_code == 303
    again = admin_browser.post("/staff/admin/topics/new", {**UNDER_NEWS, "action": "create"})
    assert again.status_code == 303
    assert "Topic product-news was created already: nothing changed." in (
        admin_browser.get(again.location).text
    )
    # The same slug with other words is a conflict, not the same topic.
    other = admin_browser.post(
        "/staff/admin/topics/new", {**UNDER_NEWS, "label": "Other", "action": "create"}
    )
    assert other.status_code == 422
    assert count_rows(engine, "topic") == 5
    assert len(_audit(engine, "topic.created")) == 1


def test_only_admins_reach_the_review(app, engine, make_staff, browser, catalogue_ready):
    from portal.staff.models import Role

    make_staff("sender@example.test", Role.CAMPAIGNS, Role.COMPLIANCE)
    person = browser()
    assert person.sign_in("sender@example.test").status_code == 303
    for action in ("review", "create", "edit"):
        answer = person.post("/staff/admin/topics/new", {**UNDER_NEWS, "action": action})
        assert answer.status_code == 403
    assert person.get("/staff/admin/topics/new").status_code == 403
    assert count_rows(engine, "topic") == 4


def test_near_duplicates_in_the_database_are_shown_once_with_a_warning(
    app, engine, clock, admin_browser, catalogue_ready
):
    # As an older version allowed: "news" beside "News", written straight to the table.
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO topic (slug, category, label, description, is_transactional, "
                "default_state, position, created_at) VALUES ('old-news', 'news ', 'Old news', "
                "'', :f, 'opt_out', 9, :now)"
            ),
            {"f": False, "now": clock.now()},
        )
    listing = admin_browser.get("/staff/admin/topics").text
    assert listing.count("<caption>News</caption>") == 1
    assert "<caption>news" not in listing
    assert "Categories written more than one way" in listing
    assert "“News”, also stored as “news ”" in listing
    assert "Category stored as “news ”" in listing
    form = admin_browser.get("/staff/admin/topics/new").text
    assert 'value="news ' not in form
    assert "some are stored as “news ”, shown to people as “News”" in form
    refused = admin_browser.post(
        "/staff/admin/topics/new", {**UNDER_NEWS, "category": "news ", "action": "create"}
    )
    assert refused.status_code == 422


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
