"""The person's time zone: what the subscribe page's browser reports, checked against the
time-zone database (portal/campaigns/zones.py ``browser_zone``) and kept on the
subscriber for local-time delivery and quiet hours."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from portal.campaigns import zones
from portal.errors import ValidationError
from tests.helpers import count_rows

URL = "/api/push/subscribe"


def _zones(engine) -> list[str | None]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT time_zone FROM subscriber ORDER BY id")).scalars())


@pytest.mark.parametrize(
    ("reported", "kept"),
    [
        ("Europe/Paris", "Europe/Paris"),
        ("Australia/Sydney", "Australia/Sydney"),
        ("America/Sao_Paulo", "America/Sao_Paulo"),
        ("UTC", "UTC"),
        # What older browsers and systems report: kept as the canonical zone.
        ("Asia/Calcutta", "Asia/Kolkata"),
        ("Europe/Kiev", "Europe/Kyiv"),
        ("US/Eastern", "America/New_York"),
        ("Etc/UTC", "UTC"),
        ("GMT", "UTC"),
        # A system set to a fixed offset: a clock all the same.
        ("Etc/GMT+5", "Etc/GMT+5"),
    ],
)
def test_the_reported_zone_is_kept_as_its_canonical_name(
    client, engine, subscriptions, reported, kept
):
    response = client.post(
        URL, json={"subscription": subscriptions().to_json(), "timeZone": reported}
    )
    assert response.status_code == 201, response.json
    assert _zones(engine) == [kept]


def test_no_zone_or_null_keeps_none(client, engine, subscriptions):
    assert client.post(URL, json={"subscription": subscriptions().to_json()}).status_code == 201
    other = client.application.test_client()
    sub = subscriptions()
    assert (
        other.post(URL, json={"subscription": sub.to_json(), "timeZone": None}).status_code == 201
    )
    assert _zones(engine) == [None, None]


def test_the_latest_browser_to_subscribe_says_where_the_person_is(client, engine, subscriptions):
    client.post(URL, json={"subscription": subscriptions().to_json(), "timeZone": "Europe/Paris"})
    # The same person (their cookie) from another browser, somewhere else.
    client.post(URL, json={"subscription": subscriptions().to_json(), "timeZone": "Asia/Tokyo"})
    assert _zones(engine) == ["Asia/Tokyo"]
    # One that does not say changes nothing.
    client.post(URL, json={"subscription": subscriptions().to_json()})
    assert _zones(engine) == ["Asia/Tokyo"]


@pytest.mark.parametrize(
    ("reported", "status"),
    [
        ("paris", 422),
        ("Europe/Paris ", 422),
        ("Mars/Olympus", 422),
        ("localtime", 422),
        ("Europe/Paris\x00", 422),
        ("x" * 500, 422),
        ("", 400),
        (5, 400),
        (["Europe/Paris"], 400),
    ],
)
def test_anything_else_is_refused_and_nothing_is_written(
    client, engine, subscriptions, reported, status
):
    response = client.post(
        URL, json={"subscription": subscriptions().to_json(), "timeZone": reported}
    )
    assert response.status_code == status, response.json
    assert response.json["error"]["field"] == "timeZone"
    assert count_rows(engine, "push_subscription") == 0
    assert count_rows(engine, "subscriber") == 0
    assert count_rows(engine, "consent_event") == 0
    assert "Set-Cookie" not in response.headers


def test_a_refused_zone_changes_nothing_for_a_known_person(client, engine, subscriptions):
    client.post(URL, json={"subscription": subscriptions().to_json(), "timeZone": "Europe/Paris"})
    before = count_rows(engine, "push_subscription")
    refused = client.post(
        URL, json={"subscription": subscriptions().to_json(), "timeZone": "Nowhere"}
    )
    assert refused.status_code == 422
    assert refused.json["error"]["code"] == "invalid_time_zone"
    assert count_rows(engine, "push_subscription") == before
    assert _zones(engine) == ["Europe/Paris"]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(max_size=80),
        st.sampled_from(sorted(zones._database()[2])),
        st.sampled_from(sorted(zones._aliases())),
        st.sampled_from(sorted(zones._database()[2])).map(str.lower),
    )
)
def test_any_text_is_a_zone_of_the_database_or_refused(text):
    """The rule alone: a name in, a zone the database can load out (never a guess), or
    the one refusal."""
    import zoneinfo

    try:
        zone = zones.browser_zone(text)
    except ValidationError as error:
        assert error.code == "invalid_time_zone"
        assert error.field == "timeZone"
        return
    assert zone in zones._database()[2] or zone == zones.UTC_ZONE
    zoneinfo.ZoneInfo(zone)
    if text in zones.zone_names():
        assert zone == text
