from __future__ import annotations

import pytest

from tests.helpers import csrf_token  # noqa: F401 - kept importable from here


@pytest.fixture
def subscribed(client, subscriptions, catalogue_ready):
    """A browser that subscribed (cookie set) and its subscription."""
    sub = subscriptions()
    response = client.post("/api/push/subscribe", json={"subscription": sub.to_json()})
    assert response.status_code == 201
    return sub
