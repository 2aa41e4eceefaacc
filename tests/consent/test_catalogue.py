"""Catalogue rules, demo data for development, regions from a trusted header."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from portal import create_app
from portal.consent import catalogue
from portal.consent.preferences import region_for_country
from portal.db import db
from portal.errors import ApiError
from portal.seams import current_portal


def test_development_seeds_demo_topics_and_a_policy_once(settings, clock):
    app = create_app(settings.with_overrides(auto_migrate=True, seed_demo_data=True), clock=clock)
    again = create_app(settings.with_overrides(auto_migrate=True, seed_demo_data=True), clock=clock)
    try:
        with db.begin(app) as session:
            topics = catalogue.all_topics(session)
            assert len(topics) == 5
            assert {t.is_transactional for t in topics} == {True, False}
            assert catalogue.current_policy(session).version == "2026-01"
        page = app.test_client().get("/preferences")
        assert page.status_code == 200
    finally:
        # Close both apps' pools: a connection left for the garbage collector surfaces
        # as a ResourceWarning (an error here) in whichever test runs next.
        for application in (app, again):
            application.extensions["portal.db"].engine.dispose()


@pytest.mark.parametrize(
    "slug", ["UPPER", "two  spaces", "-lead", "trail-", "a" * 65, "snake_case"]
)
def test_bad_slugs_are_refused(app, clock, slug):
    with pytest.raises(ApiError), db.begin(app) as session:
        catalogue.add_topic(session, slug=slug, category="c", label="l", now=clock.now())


def test_policy_digest_is_of_the_exact_text(app, clock):
    with db.begin(app) as session:
        policy = catalogue.publish_policy(session, version="v1", text="Exact.\n", now=clock.now())
    import hashlib

    assert policy.text_sha256 == hashlib.sha256(b"Exact.\n").hexdigest()


@pytest.mark.parametrize(
    ("code", "region"),
    [
        ("DE", "EU"),
        ("fr", "EU"),
        ("NO", "EU"),
        ("GB", "UK"),
        ("CA", "CA"),
        ("US", "US"),
        ("", None),
        ("XYZ", None),
        (None, None),
    ],
)
def test_region_for_country(code, region):
    assert region_for_country(code) == region


def test_region_header_sets_a_new_subscribers_region(app, engine, subscriptions):
    current_portal(app).settings = current_portal(app).settings.with_overrides(
        region_header="CF-IPCountry"
    )
    app.test_client().post(
        "/api/push/subscribe",
        json={"subscription": subscriptions().to_json()},
        headers={"CF-IPCountry": "IT"},
    )
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT region_code FROM subscriber")).scalar_one() == "EU"
