"""Fixtures of the subscription tests."""

from __future__ import annotations

import pytest

from tests.subscriptions.support import SUBSCRIBE, Holder


@pytest.fixture
def holder(app, subscriptions, catalogue_ready) -> Holder:
    """A person who subscribed from their browser and chose a topic."""
    browser = app.test_client()
    sub = subscriptions()
    answer = browser.post(
        SUBSCRIBE,
        json={"subscription": sub.to_json(), "topics": ["weekly-digest"], "policyVersion": "v1"},
    )
    assert answer.status_code == 201
    return Holder(browser, sub)
