"""POST /api/push/preferences, and consent through subscribe, change and unsubscribe."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest
import sqlalchemy as sa

from portal.consent import catalogue
from portal.consent.recipients import recipients
from portal.db import db
from portal.seams import current_portal
from tests.helpers import count_rows, csrf_token, stored_preferences

URL = "/api/push/preferences"


def _body(endpoint, decisions=None, **overrides):
    body = {
        "endpoint": endpoint,
        "decisions": decisions
        if decisions is not None
        else [{"slug": "offers", "state": "opt_in"}],
        "policyVersion": "v1",
        "decidedAt": "2025-12-31T23:00:00Z",
    }
    body.update(overrides)
    return body


def test_preferences_api_stores_the_set_and_answers_it(client, engine, subscribed):
    response = client.post(
        URL,
        json=_body(
            subscribed.endpoint,
            [
                {"slug": "offers", "state": "opt_in"},
                {"slug": "security-alerts", "state": "opt_out"},
                {"slug": "weekly-digest", "state": "unset"},
            ],
        ),
    )
    assert response.status_code == 200
    stored = {p["slug"]: p for p in response.json["preferences"]}
    assert stored["offers"]["state"] == "opt_in"
    assert stored["offers"]["effective"] == "on"
    assert stored["offers"]["decidedAt"].startswith("2025-12-31T23:00:00")
    assert stored["security-alerts"]["reason"] == "explicit_opt_out"
    assert stored["weekly-digest"]["state"] == "unset"
    assert stored["order-updates"]["reason"] == "default_off"
    with engine.connect() as conn:
        events = conn.execute(
            sa.text(
                "SELECT new_state, decided_at, recorded_at FROM consent_event WHERE kind = 'preference_changed' ORDER BY seq"
            )
        ).all()
    assert [e[0] for e in events] == ["opt_in", "opt_out"]  # unset → unset is no transition
    assert str(events[0][1]).startswith("2025-12-31 23:00:00")  # client clock
    assert str(events[0][2]).startswith("2026-01-01 00:00:00")  # server clock


@pytest.fixture
def retired(app, subscribed):
    app.test_cli_runner().invoke(args=["portal", "topic", "retire", "order-updates"])


BAD = [
    (
        "unknown-slug",
        lambda e: _body(e, [{"slug": "nope", "state": "opt_in"}]),
        422,
        "decisions[0].slug",
    ),
    (
        "retired-slug",
        lambda e: _body(e, [{"slug": "order-updates", "state": "opt_in"}]),
        422,
        "decisions[0].slug",
    ),
    (
        "bad-state",
        lambda e: _body(e, [{"slug": "offers", "state": "yes"}]),
        422,
        "decisions[0].state",
    ),
    (
        "state-null",
        lambda e: _body(e, [{"slug": "offers", "state": None}]),
        400,
        "decisions[0].state",
    ),
    (
        "duplicate-slug",
        lambda e: _body(
            e, [{"slug": "offers", "state": "opt_in"}, {"slug": "offers", "state": "opt_out"}]
        ),
        422,
        "decisions[1].slug",
    ),
    (
        "missing-endpoint",
        lambda e: {k: v for k, v in _body(e).items() if k != "endpoint"},
        400,
        "endpoint",
    ),
    (
        # Refused as any endpoint this browser does not hold: nothing says it is unknown.
        "unknown-endpoint",
        lambda e: _body("https://fcm.googleapis.com/fcm/send/unknown"),
        403,
        "endpoint",
    ),
    ("unknown-policy", lambda e: _body(e, policyVersion="v9"), 422, "policyVersion"),
    (
        "missing-policy",
        lambda e: {k: v for k, v in _body(e).items() if k != "policyVersion"},
        400,
        "policyVersion",
    ),
    ("empty-decisions", lambda e: _body(e, []), 422, "decisions"),
    ("decisions-not-list", lambda e: _body(e, {"offers": "opt_in"}), 400, "decisions"),
    ("decision-not-object", lambda e: _body(e, ["offers"]), 400, "decisions[0]"),
    ("decided-at-garbage", lambda e: _body(e, decidedAt="yesterday"), 422, "decidedAt"),
    ("decided-at-naive", lambda e: _body(e, decidedAt="2026-01-01T00:00:00"), 422, "decidedAt"),
    ("decided-at-future", lambda e: _body(e, decidedAt="2027-01-01T00:00:00Z"), 422, "decidedAt"),
    (
        # Before year 1 once in UTC: out of range, not a crash.
        "decided-at-before-year-one",
        lambda e: _body(e, decidedAt="0001-01-01T00:00:00+14:00"),
        422,
        "decidedAt",
    ),
    (
        # The server clock is 2026-01-01T00:00:00Z; the skew allowed is 24 hours either way.
        "decided-at-over-a-day-before",
        lambda e: _body(e, decidedAt="2025-12-30T23:59:59Z"),
        422,
        "decidedAt",
    ),
    (
        "decided-at-over-a-day-after",
        lambda e: _body(e, decidedAt="2026-01-02T00:00:01Z"),
        422,
        "decidedAt",
    ),
    ("bad-source", lambda e: _body(e, source="import"), 422, "source"),
    # Only the host product's own calls reach this route: the preference centre and the
    # subscribe page post elsewhere, so neither may be claimed here.
    ("preference-centre-source", lambda e: _body(e, source="preference-centre"), 422, "source"),
    ("subscribe-page-source", lambda e: _body(e, source="subscribe-page"), 422, "source"),
    ("service-worker-source", lambda e: _body(e, source="service-worker"), 422, "source"),
]


# The error codes of the refusals the contract names.
CODES = {
    "unknown-slug": "unknown_topic",
    "retired-slug": "unknown_topic",
    "bad-state": "invalid_state",
    "duplicate-slug": "duplicate_topic",
    "missing-endpoint": "missing_field",
    "unknown-endpoint": "not_your_subscription",
    "unknown-policy": "unknown_policy_version",
}


@pytest.mark.parametrize(
    ("case", "make", "status", "field"), [pytest.param(i, m, s, f, id=i) for i, m, s, f in BAD]
)
def test_bad_preferences_write_nothing(
    client, engine, subscribed, retired, case, make, status, field
):
    events = count_rows(engine, "consent_event")
    response = client.post(URL, json=make(subscribed.endpoint))
    assert response.status_code == status, response.json
    assert list(response.json) == ["error"]
    error = response.json["error"]
    assert set(error) == {"code", "message", "field"}
    assert error["field"] == field
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == CODES.get(case, error["code"])
    assert count_rows(engine, "topic_preference") == 0
    assert count_rows(engine, "consent_event") == events


@pytest.mark.parametrize(
    "decided_at", ["2025-12-31T00:00:01Z", "2026-01-01T23:59:59Z", "2026-01-01T23:59:59+23:00"]
)
def test_a_decision_within_a_day_of_the_server_clock_is_accepted(client, subscribed, decided_at):
    response = client.post(URL, json=_body(subscribed.endpoint, decidedAt=decided_at))
    assert response.status_code == 200, response.json


def test_the_allowed_skew_of_decided_at_is_a_setting(app, client, engine, subscribed):
    settings = current_portal(app).settings.with_overrides(decided_at_max_skew_seconds=3600)
    current_portal(app).settings = settings
    events = count_rows(engine, "consent_event")
    for late in ("2025-12-31T22:59:59Z", "2026-01-01T01:00:01Z"):
        response = client.post(URL, json=_body(subscribed.endpoint, decidedAt=late))
        assert response.status_code == 422
        assert response.json["error"]["field"] == "decidedAt"
        assert "1 hour" in response.json["error"]["message"]
    assert count_rows(engine, "consent_event") == events
    ok = client.post(URL, json=_body(subscribed.endpoint, decidedAt="2025-12-31T23:00:01Z"))
    assert ok.status_code == 200


def test_a_decision_under_a_notice_already_replaced_is_refused_at_both_doors(
    client, engine, clock, subscribed
):
    """The page was opened under v1; v2 is published; the person then decides. The form
    refuses the save (409, showing the new notice) and so does the JSON door, writing
    nothing; a decision queued offline before v2 came out is still taken under v1."""
    page = client.get("/preferences").text
    clock.advance(hours=1)
    with db.begin(client.application) as session:
        catalogue.publish_policy(session, version="v2", text="New terms.", now=clock.now())
    published = clock.now()
    clock.advance(minutes=5)
    events = count_rows(engine, "consent_event")
    form = client.post(
        "/preferences",
        data={
            "csrf_token": csrf_token(page),
            "policy_version": "v1",
            "visible": ["offers"],
            "topics": ["offers"],
        },
    )
    assert form.status_code == 409
    refused = client.post(URL, json=_body(subscribed.endpoint, decidedAt=clock.now().isoformat()))
    assert refused.status_code == 409
    assert refused.json["error"] == {
        "code": "policy_superseded",
        "message": "notice 'v1' had been replaced by 'v2' when this decision was made: "
        "show the person the notice in force and ask again",
        "field": "policyVersion",
    }
    assert count_rows(engine, "consent_event") == events
    queued = _body(
        subscribed.endpoint, decidedAt=(published - dt.timedelta(minutes=10)).isoformat()
    )
    assert client.post(URL, json=queued).status_code == 200
    current = _body(subscribed.endpoint, policyVersion="v2", decidedAt=clock.now().isoformat())
    assert client.post(URL, json=current).status_code == 200


def test_preferences_of_a_revoked_device_still_apply_to_the_person(client, engine, subscribed):
    """Preferences are per subscriber; the endpoint is only the address."""
    client.post("/api/push/unsubscribe", json={"endpoint": subscribed.endpoint})
    assert client.post(URL, json=_body(subscribed.endpoint)).status_code == 200


def test_subscribe_with_topics_records_choices_and_grant(
    client, engine, subscriptions, catalogue_ready
):
    sub = subscriptions()
    response = client.post(
        "/api/push/subscribe",
        json={
            "subscription": sub.to_json(),
            "topics": ["weekly-digest"],
            "policyVersion": "v1",
            "source": "subscribe-page",
        },
    )
    assert response.status_code == 201
    prefs = stored_preferences(engine)
    with engine.connect() as conn:
        kinds = conn.execute(sa.text("SELECT kind, source FROM consent_event ORDER BY seq")).all()
        versions = conn.execute(sa.text("SELECT policy_version FROM consent_event")).scalars()
        grant = conn.execute(sa.text("SELECT grant_event_seq FROM push_subscription")).scalar_one()
    # Chosen → opt_in; marketing shown but not chosen → opt_out; transactional follow the grant.
    assert prefs == {"weekly-digest": "opt_in", "offers": "opt_out"}
    assert [k for k, _ in kinds] == [
        "permission_granted",
        "subscribed",
        "preference_changed",
        "preference_changed",
    ]
    assert {s for _, s in kinds} == {"subscribe-page"}
    # The grant and the subscription cite the notice the page showed, as the choices do.
    assert set(versions) == {"v1"}
    assert grant == 1
    # Re-posting the same subscription is not a new grant.
    client.post("/api/push/subscribe", json={"subscription": sub.to_json()})
    assert count_rows(engine, "consent_event") == 4


@pytest.mark.parametrize(
    ("extra", "status", "field"),
    [
        ({"topics": ["nope"], "policyVersion": "v1"}, 422, "topics[0]"),
        ({"topics": ["offers"]}, 400, "policyVersion"),
        ({"topics": ["offers"], "policyVersion": "v7"}, 422, "policyVersion"),
        ({"topics": "offers", "policyVersion": "v1"}, 400, "topics"),
        ({"topics": ["offers", "offers"], "policyVersion": "v1"}, 422, "topics"),
        ({"source": "import"}, 422, "source"),
        ({"policyVersion": "v7"}, 422, "policyVersion"),
        ({"policyVersion": 1}, 400, "policyVersion"),
        ({"policyVersion": ""}, 400, "policyVersion"),
    ],
)
def test_subscribe_with_bad_topics_writes_nothing(
    client, engine, subscriptions, catalogue_ready, extra, status, field
):
    response = client.post(
        "/api/push/subscribe", json={"subscription": subscriptions().to_json(), **extra}
    )
    assert response.status_code == status
    assert response.json["error"]["field"] == field
    for table in ("push_subscription", "subscriber", "consent_event", "topic_preference"):
        assert count_rows(engine, table) == 0


def _grant_versions(engine) -> dict[str, str | None]:
    with engine.connect() as conn:
        return dict(
            conn.execute(
                sa.text(
                    "SELECT kind, policy_version FROM consent_event"
                    " WHERE kind IN ('permission_granted', 'subscribed')"
                )
            ).all()
        )


def test_subscribe_with_only_a_notice_version_records_it_on_the_grant(
    client, engine, subscriptions, catalogue_ready
):
    """A page that shows the notice but offers no topics still says which notice the
    person saw when they allowed notifications."""
    response = client.post(
        "/api/push/subscribe",
        json={"subscription": subscriptions().to_json(), "policyVersion": "v1"},
    )
    assert response.status_code == 201
    assert _grant_versions(engine) == {"permission_granted": "v1", "subscribed": "v1"}
    assert count_rows(engine, "topic_preference") == 0


def test_subscribe_without_a_notice_version_records_none(
    client, engine, subscriptions, catalogue_ready
):
    """An API caller that showed no notice claims none: nothing is made up for it."""
    response = client.post("/api/push/subscribe", json={"subscription": subscriptions().to_json()})
    assert response.status_code == 201
    assert _grant_versions(engine) == {"permission_granted": None, "subscribed": None}


def test_a_renewed_subscription_cites_the_notice_its_page_showed(
    client, engine, clock, subscriptions, catalogue_ready
):
    """Back from revoked (the page renewing after a heartbeat): a fresh grant, on the
    notice shown this time."""
    sub = subscriptions()
    client.post("/api/push/subscribe", json={"subscription": sub.to_json()})
    client.post("/api/push/unsubscribe", json={"endpoint": sub.endpoint})
    with db.begin(client.application) as session:
        catalogue.publish_policy(session, version="v2", text="Newer words.", now=clock.now())
    again = client.post(
        "/api/push/subscribe", json={"subscription": sub.to_json(), "policyVersion": "v2"}
    )
    assert again.status_code == 200
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT kind, policy_version FROM consent_event"
                " WHERE kind IN ('permission_granted', 'subscribed') ORDER BY seq"
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        ("permission_granted", None),
        ("subscribed", None),
        ("permission_granted", "v2"),
        ("subscribed", "v2"),
    ]


def test_change_carries_preferences_with_an_endpoint_rotated_event(
    app, client, engine, subscriptions, subscribed
):
    client.post(URL, json=_body(subscribed.endpoint))
    new = subscriptions()
    # The service worker's request, proving the old subscription with its auth secret.
    response = app.test_client().post(
        "/api/push/change",
        json={
            "oldEndpoint": subscribed.endpoint,
            "oldAuth": subscribed.auth_b64,
            "subscription": new.to_json(),
        },
    )
    assert response.json["moved"] is True
    with engine.connect() as conn:
        rotated = conn.execute(
            sa.text(
                "SELECT subscription_id, previous_state, context FROM consent_event WHERE kind = 'endpoint_rotated'"
            )
        ).one()
        grants = conn.execute(
            sa.text("SELECT count(*) FROM consent_event WHERE kind = 'permission_granted'")
        ).scalar_one()
        new_grant = conn.execute(
            sa.text("SELECT grant_event_seq FROM push_subscription WHERE endpoint = :e"),
            {"e": new.endpoint},
        ).scalar_one()
    assert str(rotated.subscription_id).replace("-", "") == response.json["id"].replace("-", "")
    assert rotated.previous_state == "pending"
    assert "previous_subscription" in rotated.context
    assert grants == 1  # the grant carries over; rotation is not a new one
    assert new_grant == 1
    # The new endpoint speaks for the same person: its preferences are already there.
    answer = client.post(
        URL,
        json=_body(new.endpoint, [{"slug": "weekly-digest", "state": "opt_in"}], auth=new.auth_b64),
    )
    states = {p["slug"]: p["state"] for p in answer.json["preferences"]}
    assert states["offers"] == "opt_in"


def test_cli_topic_and_policy_commands(app, engine, tmp_path):
    runner = app.test_cli_runner()
    ok = runner.invoke(
        args=[
            "portal",
            "topic",
            "add",
            "flash-sales",
            "--new-category",
            "Offers",
            "--label",
            "Flash sales",
            "--default",
            "opt_in",
        ]
    )
    assert ok.exit_code == 0
    assert "added flash-sales" in ok.output
    receipts = runner.invoke(
        args=[
            "portal",
            "topic",
            "add",
            "receipts",
            "--new-category",
            "Your account",
            "--label",
            "Receipts",
            "--description",
            "A receipt for every order.",
            "--transactional",
        ]
    )
    assert receipts.exit_code == 0, receipts.output
    with engine.connect() as conn:
        rows = {
            r.slug: tuple(r)[1:]
            for r in conn.execute(
                sa.text(
                    "SELECT slug, category, description, is_transactional, default_state, "
                    "retired_at FROM topic"
                )
            )
        }
    assert rows == {
        "flash-sales": ("Offers", "", False, "opt_in", None),
        "receipts": ("Your account", "A receipt for every order.", True, "opt_out", None),
    }
    listing = runner.invoke(args=["portal", "topic", "list"])
    assert listing.exit_code == 0
    lines = {line.split()[0]: line.split() for line in listing.output.splitlines()[1:]}
    assert lines["flash-sales"][-3:] == ["marketing", "opt_in", "active"]
    assert lines["receipts"][-3:] == ["transactional", "opt_out", "active"]
    assert (
        runner.invoke(
            args=[
                "portal",
                "topic",
                "add",
                "flash-sales",
                "--category",
                "Offers",
                "--label",
                "Again",
            ]
        ).exit_code
        == 1
    )
    bad = runner.invoke(
        args=["portal", "topic", "add", "Bad Slug", "--category", "x", "--label", "y"]
    )
    assert bad.exit_code == 1
    assert "slug" in bad.output
    notice = tmp_path / "n.txt"
    notice.write_bytes("Exact words — kept as written.\n".encode())
    published = runner.invoke(
        args=["portal", "policy", "publish", "2026-02", "--file", str(notice)]
    )
    assert published.exit_code == 0
    digest = hashlib.sha256(notice.read_bytes()).hexdigest()
    assert f"sha256={digest}" in published.output
    with engine.connect() as conn:
        stored = conn.execute(
            sa.text("SELECT text, text_sha256 FROM policy_version WHERE version = '2026-02'")
        ).one()
    assert tuple(stored) == ("Exact words — kept as written.\n", digest)
    again = runner.invoke(args=["portal", "policy", "publish", "2026-02", "--file", str(notice)])
    assert again.exit_code == 1
    assert "immutable" in again.output
    assert runner.invoke(args=["portal", "topic", "retire", "missing"]).exit_code == 1


def test_a_persons_devices_share_their_preferences(app, client, engine, subscriptions, subscribed):
    """Preferences are per subscriber: a decision made through one device's endpoint
    holds on the other, and both devices receive what the person chose."""
    laptop = subscriptions("autopush")
    assert (
        client.post("/api/push/subscribe", json={"subscription": laptop.to_json()}).status_code
        == 201
    )
    # This client's device cookie names the laptop now; the phone's endpoint is proved
    # with its own auth secret.
    phone = _body(subscribed.endpoint, [{"slug": "offers", "state": "opt_in"}])
    assert client.post(URL, json={**phone, "auth": subscribed.auth_b64}).status_code == 200
    answer = client.post(
        URL, json=_body(laptop.endpoint, [{"slug": "weekly-digest", "state": "opt_in"}])
    )
    states = {p["slug"]: p["state"] for p in answer.json["preferences"]}
    assert states["offers"] == "opt_in"
    assert states["weekly-digest"] == "opt_in"
    assert count_rows(engine, "topic_preference") == 2  # one row per topic, not per device
    with db.begin(app) as session:
        offers = catalogue.topic_by_slug(session, "offers")
        devices = {r.subscription_id for r in recipients(session, offers.id)}
    with engine.connect() as conn:
        assert len(set(conn.execute(sa.text("SELECT subscriber_id FROM push_subscription")))) == 1
    assert len(devices) == 2
