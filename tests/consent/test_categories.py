"""Categories: chosen from those in use or added explicitly, never a near-duplicate.

One rule (:func:`portal.consent.catalogue.check_new_topic`) for the staff form, the
command line and seeds; near-duplicates an older version stored are shown as one.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from portal.consent import catalogue
from portal.db import db
from portal.errors import ApiError
from tests.helpers import Unchanged, count_rows


def _add(app, clock, category, *, new, slug="product-news"):
    with db.begin(app) as session:
        return catalogue.add_topic(
            session,
            slug=slug,
            category=category,
            new_category=new,
            label="Product news",
            now=clock.now(),
        ).category


def _refusal(app, clock, category, *, new) -> ApiError:
    unchanged = Unchanged(app.extensions["portal.db"].engine)
    with pytest.raises(ApiError) as refused:
        _add(app, clock, category, new=new, slug="refused")
    assert unchanged.changed() == []
    return refused.value


@pytest.mark.parametrize(
    "name",
    # Invisible format characters too: a zero-width space, a soft hyphen, a word joiner.
    ["News", "news", " news ", "NEWS", "News\u00a0", "ｎｅｗｓ", "nEwS", "News\u200b",
     "Ne\u00adws", "\u2060News"],
)  # fmt: skip
def test_a_new_category_like_one_in_use_is_refused_naming_it(app, clock, catalogue_ready, name):
    error = _refusal(app, clock, name, new=True)
    assert (error.code, error.field) == ("category_exists", "new_category")
    assert 'there is a category "News" already: choose' in error.message


def test_a_category_in_use_written_differently_is_refused_naming_it(app, clock, catalogue_ready):
    for new in (False, None):  # the form and the command line's --category, and seeds
        error = _refusal(app, clock, "news", new=new)
        assert error.code == "category_near_duplicate"
        assert error.message == '"news" is the category "News" written differently: choose "News"'


def test_choosing_a_category_in_use_joins_it(app, clock, catalogue_ready):
    assert _add(app, clock, "News", new=False) == "News"


def test_an_unknown_category_must_be_added_explicitly(app, clock, catalogue_ready):
    error = _refusal(app, clock, "Events", new=False)
    assert error.code == "unknown_category"
    assert "add it as a new category" in error.message
    assert _add(app, clock, "  Local   events ", new=True) == "Local events"
    # The first topic of a new category makes it one in use.
    assert _add(app, clock, "Local events", new=False, slug="fairs") == "Local events"
    assert _refusal(app, clock, "local events", new=True).code == "category_exists"


@pytest.mark.parametrize(("name", "code"), [("", "missing_field"), ("x" * 65, "too_long")])
def test_a_category_needs_a_name_of_a_category_size(app, clock, catalogue_ready, name, code):
    for new in (True, False):
        assert _refusal(app, clock, name, new=new).code == code


def test_checking_a_topic_writes_nothing(app, engine, clock, catalogue_ready):
    unchanged = Unchanged(engine)
    with db.begin(app) as session:
        draft = catalogue.check_new_topic(
            session,
            slug="fairs",
            category="Events",
            new_category=True,
            label=" Fairs ",
            description="Once a year.",
        )
    assert draft == catalogue.TopicDraft(
        slug="fairs",
        category="Events",
        category_is_new=True,
        label="Fairs",
        description="Once a year.",
        transactional=False,
        default_state="opt_out",
    )
    assert unchanged.changed() == []


def _insert_near_duplicate(engine, clock, *, slug="old-news", category="news", retired=False):
    """What an older version let through: a topic under "news" beside "News"."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO topic (slug, category, label, description, is_transactional, "
                "default_state, position, created_at, retired_at) VALUES (:slug, :category, "
                "'Old news', '', :f, 'opt_out', 9, :now, :retired)"
            ),
            {
                "slug": slug,
                "category": category,
                "f": False,
                "now": clock.now(),
                "retired": clock.now() if retired else None,
            },
        )


def test_near_duplicates_stored_earlier_are_one_category_named_as_first_shown(
    app, engine, clock, catalogue_ready
):
    _insert_near_duplicate(engine, clock)
    with db.begin(app) as session:
        in_use = {c.name: c for c in catalogue.categories_in_use(session)}
        assert list(in_use) == ["Your account", "News", "Offers"]
        assert in_use["News"].other_spellings == ("news",)
        assert in_use["News"].topics == 2
        groups = catalogue.by_category(catalogue.active_topics(session))
        assert [(g.name, [t.slug for t in g.topics]) for g in groups] == [
            ("Your account", ["security-alerts", "order-updates"]),
            ("News", ["weekly-digest", "old-news"]),
            ("Offers", ["offers"]),
        ]
    # Nothing rewritten: the stored spelling stays, and so does the log.
    assert count_rows(engine, "consent_event") == 0
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT category FROM topic WHERE slug = 'old-news'"))
        assert stored.scalar() == "news"
    # New topics can take only the name shown.
    assert _refusal(app, clock, "news", new=False).code == "category_near_duplicate"
    assert _add(app, clock, "News", new=False) == "News"


def test_an_active_spelling_names_the_category_over_a_retired_one(
    app, engine, clock, catalogue_ready
):
    with db.begin(app) as session:
        catalogue.retire_topic(session, "weekly-digest", now=clock.now())
    _insert_near_duplicate(engine, clock)
    with db.begin(app) as session:
        names = [c.name for c in catalogue.categories_in_use(session)]
        assert names == ["Your account", "news", "Offers"]
        groups = catalogue.by_category(catalogue.active_topics(session))
        assert "news" in [g.name for g in groups]


def test_the_preference_centre_shows_near_duplicates_under_one_heading(
    client, engine, clock, subscribed
):
    _insert_near_duplicate(engine, clock)
    with client.application.app_context():
        catalogue.forget(db.session)
    html = client.get("/preferences").text
    assert html.count("<legend>News</legend>") == 1
    assert "<legend>news</legend>" not in html
    assert 'id="topic-old-news"' in html


# -- the command line -----------------------------------------------------------------------


def _cli(app, *args):
    return app.test_cli_runner().invoke(
        args=["portal", "topic", "add", "product-news", "--label", "Product news", *args]
    )


def test_the_command_line_chooses_or_adds_a_category_explicitly(app, engine, catalogue_ready):
    joined = _cli(app, "--category", "News")
    assert joined.exit_code == 0, joined.output
    assert "added product-news (News, default opt_out)" in joined.output
    added = app.test_cli_runner().invoke(
        args=["portal", "topic", "add", "fairs", "--label", "Fairs", "--new-category", "Events"]
    )
    assert added.exit_code == 0, added.output
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.text("SELECT slug, category FROM topic")).all())
    assert (rows["product-news"], rows["fairs"]) == ("News", "Events")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--new-category", "news"),
            'error: there is a category "News" already: choose "News" rather than adding "news"\n',
        ),
        (
            ("--category", "news"),
            'error: "news" is the category "News" written differently: choose "News"\n',
        ),
        (
            ("--category", "Events"),
            'error: there is no category "Events": choose one in use, or add it as a new '
            "category\n",
        ),
    ],
)
def test_the_command_line_refuses_what_the_form_refuses(
    app, engine, catalogue_ready, args, message
):
    unchanged = Unchanged(engine)
    result = _cli(app, *args)
    assert result.exit_code == 1
    assert result.output == message
    assert unchanged.changed() == []


@pytest.mark.parametrize("args", [(), ("--category", "News", "--new-category", "Events")])
def test_the_command_line_needs_exactly_one_category_option(app, engine, catalogue_ready, args):
    result = _cli(app, *args)
    assert result.exit_code == 2
    assert "give either --category (one in use) or --new-category" in result.output
    assert count_rows(engine, "topic") == 4
