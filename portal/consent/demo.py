"""Demo topics and a policy text for development, so a fresh start shows a working portal."""

from __future__ import annotations

from flask import Flask

from portal.consent import catalogue
from portal.db import db
from portal.seams import current_portal

# One line per paragraph: pages wrap the text themselves and keep the line breaks given.
POLICY = "\n".join(
    [
        "We send notifications to this browser only about the topics you choose.",
        "",
        "- Account messages (such as security alerts) are part of allowing notifications; "
        "you can turn them off in the preference centre at any time.",
        "- Everything else is off until you turn it on.",
        "- We record each choice you make, when you made it and which version of this notice "
        "you saw, so we can show that we respected it.",
        "- You can stop notifications on any device, or ask us to erase your data, from the "
        "preference centre.",
        "",
    ]
)

TOPICS = [
    (
        "security-alerts",
        "Your account",
        "Security alerts",
        "Sign-ins from new devices and password changes.",
        True,
        "opt_in",
    ),
    (
        "order-updates",
        "Your account",
        "Order updates",
        "When an order ships or is delivered.",
        True,
        "opt_in",
    ),
    (
        "weekly-digest",
        "News",
        "Weekly digest",
        "A summary of the week, every Monday.",
        False,
        "opt_out",
    ),
    (
        "product-news",
        "News",
        "Product news",
        "New features, at most twice a month.",
        False,
        "opt_out",
    ),
    ("offers", "Offers", "Offers and discounts", "Deals we think you will like.", False, "opt_out"),
]


def seed(app: Flask) -> None:
    with db.begin(app) as session:
        if catalogue.all_topics(session) or catalogue.current_policy(session):
            return
        now = current_portal(app).clock.now()
        catalogue.publish_policy(session, version="2026-01", text=POLICY, now=now)
        for slug, category, label, description, transactional, default in TOPICS:
            catalogue.add_topic(
                session,
                slug=slug,
                category=category,
                label=label,
                description=description,
                transactional=transactional,
                default_state=default,
                now=now,
            )
