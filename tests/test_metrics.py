"""GET /metrics: open by default, or only to the bearer of METRICS_TOKEN."""

from __future__ import annotations

import logging

import pytest

from portal.seams import current_portal

TOKEN = "scrape-token-7b1e0c2d9a4f"


@pytest.fixture
def guarded(app):
    current_portal(app).settings = current_portal(app).settings.with_overrides(metrics_token=TOKEN)
    return app


def test_metrics_are_open_without_a_token(client):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert b"portal_http_requests_total" in response.data


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"Basic {TOKEN}",
        TOKEN,
        "Bearer scrape-token-ü",
    ],
)
def test_a_missing_or_wrong_token_is_refused(guarded, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    response = guarded.test_client().get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"portal_http_requests_total" not in response.data


def test_the_right_token_reads_the_metrics(guarded, caplog):
    caplog.set_level(logging.DEBUG)
    client = guarded.test_client()
    for written in (f"Bearer {TOKEN}", f"bearer {TOKEN}"):
        response = client.get("/metrics", headers={"Authorization": written})
        assert response.status_code == 200
        assert b"portal_http_requests_total" in response.data
    client.get("/metrics", headers={"Authorization": "Bearer wrong"})
    assert all(TOKEN not in record.getMessage() for record in caplog.records)


def test_the_token_is_compared_in_constant_time(guarded, monkeypatch):
    compared = []
    import hmac

    real = hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr("portal.metrics.hmac.compare_digest", spy)
    guarded.test_client().get("/metrics", headers={"Authorization": "Bearer nope"})
    assert compared and all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in compared)
