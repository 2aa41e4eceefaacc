from __future__ import annotations

import re

import pytest

from portal.consent import catalogue
from portal.db import db

TOPICS = [
    # slug, category, transactional, default
    ("security-alerts", "Your account", True, "opt_in"),
    ("order-updates", "Your account", True, "opt_out"),
    ("weekly-digest", "News", False, "opt_in"),
    ("offers", "Offers", False, "opt_out"),
]


@pytest.fixture
def catalogue_ready(app, clock):
    """Four topics (each class × each default) and a published policy."""
    with db.begin(app) as session:
        catalogue.publish_policy(
            session, version="v1", text="We send what you choose.", now=clock.now()
        )
        for slug, category, transactional, default in TOPICS:
            catalogue.add_topic(
                session,
                slug=slug,
                category=category,
                label=slug.replace("-", " ").title(),
                description=f"About {slug}.",
                transactional=transactional,
                default_state=default,
                now=clock.now(),
            )
    return app


def csrf_token(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the page has no CSRF token"
    return match.group(1)


@pytest.fixture
def subscribed(client, subscriptions, catalogue_ready):
    """A browser that subscribed (cookie set) and its subscription."""
    sub = subscriptions()
    response = client.post("/api/push/subscribe", json={"subscription": sub.to_json()})
    assert response.status_code == 201
    return sub
