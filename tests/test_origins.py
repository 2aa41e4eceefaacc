"""The site's public origin (PUBLIC_URL): the JSON API's same-origin check and every
origin the portal records compare scheme, host and port with it, never with the Host
header a client chose."""

from __future__ import annotations

import pytest
from flask import Flask

from portal import create_app
from portal.config import ConfigError, Settings
from tests.conftest import make_settings
from tests.helpers import all_rows, count_rows
from tests.test_config import GOOD_PRODUCTION

SUBSCRIBE = "/api/push/subscribe"


@pytest.fixture
def public_app(database_url, tmp_path, clock, catalogue_ready) -> Flask:
    app = create_app(
        make_settings(database_url, str(tmp_path / "public"), public_url="https://portal.example"),
        clock=clock,
    )
    app.config["TESTING"] = True
    yield app
    app.extensions["portal.db"].engine.dispose()


def _subscribe(client, subscriptions, **kwargs):
    return client.post(SUBSCRIBE, json={"subscription": subscriptions().to_json()}, **kwargs)


@pytest.mark.parametrize(
    ("base_url", "origin"),
    [
        # The Host header is the client's to choose: spoofed, it must not vouch for itself.
        ("https://evil.example", "https://evil.example"),
        # Another scheme, and another port, of the right host.
        ("http://portal.example", "http://portal.example"),
        ("https://portal.example", "http://portal.example"),
        ("https://portal.example:8443", "https://portal.example:8443"),
        ("https://portal.example", "https://portal.example.evil.example"),
    ],
)
def test_only_the_public_origin_passes_whatever_the_host_header_says(
    public_app, engine, subscriptions, base_url, origin
):
    client = public_app.test_client()
    refused = _subscribe(client, subscriptions, base_url=base_url, headers={"Origin": origin})
    assert refused.status_code == 403
    assert refused.json["error"]["code"] == "cross_origin"
    assert count_rows(engine, "push_subscription") == 0


def test_the_public_origin_passes_behind_a_proxy_that_rewrites_the_host(
    public_app, engine, subscriptions
):
    client = public_app.test_client()
    accepted = _subscribe(
        client,
        subscriptions,
        base_url="http://10.0.0.7:8000",  # what the app sees behind the proxy
        headers={"Origin": "https://portal.example"},
    )
    assert accepted.status_code == 201
    # A default port written out is the same origin.
    again = _subscribe(
        client,
        subscriptions,
        base_url="http://10.0.0.7:8000",
        headers={"Origin": "https://PORTAL.example:443"},
    )
    assert again.status_code == 201


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (SUBSCRIBE, None),
        ("/api/push/heartbeat", {"endpoint": "https://fcm.googleapis.com/fcm/send/x"}),
        ("/api/push/unsubscribe", {"endpoint": "https://fcm.googleapis.com/fcm/send/x"}),
        ("/api/push/receipt", {"deliveryId": "1", "event": "shown"}),
        ("/api/push/preferences", {"endpoint": "https://fcm.googleapis.com/fcm/send/x"}),
    ],
)
def test_origin_null_is_refused_on_state_changing_routes(
    client, engine, subscriptions, catalogue_ready, path, body
):
    # "null" is what a sandboxed frame, a data: page or a file: page sends: never us.
    payload = body if body is not None else {"subscription": subscriptions().to_json()}
    refused = client.post(path, json=payload, headers={"Origin": "null"})
    assert refused.status_code == 403
    assert refused.json["error"]["code"] == "cross_origin"
    assert count_rows(engine, "push_subscription") == 0
    assert count_rows(engine, "delivery_receipt") == 0


def test_origin_null_may_read_the_public_key(client):
    assert client.get("/api/push/vapid-public-key", headers={"Origin": "null"}).status_code == 200


def test_in_development_the_request_s_own_origin_is_the_public_one(
    client, engine, subscriptions, catalogue_ready
):
    assert _subscribe(
        client, subscriptions, headers={"Origin": "http://localhost"}
    ).status_code == (201)
    for other in ("https://localhost", "http://localhost:5001", "http://127.0.0.1"):
        refused = _subscribe(client, subscriptions, headers={"Origin": other})
        assert refused.status_code == 403, other
    assert count_rows(engine, "push_subscription") == 1


def test_the_recorded_origin_is_the_public_one(public_app, engine, subscriptions):
    client = public_app.test_client()
    answer = _subscribe(client, subscriptions, base_url="http://evil.example")
    assert answer.status_code == 201
    (row,) = all_rows(engine, "push_subscription")
    assert row["origin"] == "https://portal.example"


def test_production_refuses_to_start_without_a_public_url(tmp_path):
    environ = {k: v for k, v in GOOD_PRODUCTION.items() if k != "PUBLIC_URL"}
    with pytest.raises(ConfigError, match="PUBLIC_URL is missing"):
        Settings.from_env(environ, str(tmp_path))
    with pytest.raises(ConfigError, match="PUBLIC_URL must be an https:// origin"):
        Settings.from_env({**GOOD_PRODUCTION, "PUBLIC_URL": "http://portal.example"}, str(tmp_path))


@pytest.mark.parametrize(
    "value",
    [
        "portal.example",
        "ftp://portal.example",
        "https://",
        "https://user@portal.example",
        "https://portal.example/app",
        "https://portal.example/?q=1",
        "https://portal.example/#top",
        "https://[::1",
    ],
)
def test_a_public_url_that_is_not_an_origin_is_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="PUBLIC_URL"):
        Settings.from_env({"PUBLIC_URL": value}, str(tmp_path))


def test_the_public_url_is_kept_as_its_origin(tmp_path):
    settings = Settings.from_env({"PUBLIC_URL": "HTTPS://Portal.Example:443/"}, str(tmp_path))
    assert settings.public_url == "https://portal.example"
    assert Settings.from_env(GOOD_PRODUCTION, str(tmp_path)).public_url == (
        "https://portal.example.com"
    )
    assert Settings.from_env({}, str(tmp_path / "dev")).public_url is None


@pytest.mark.parametrize(
    ("text", "origin"),
    [
        ("https://portal.example", "https://portal.example"),
        ("HTTPS://PORTAL.EXAMPLE:443", "https://portal.example"),
        ("http://portal.example:80", "http://portal.example"),
        ("http://portal.example:8080", "http://portal.example:8080"),
        ("https://bücher.example", "https://xn--bcher-kva.example"),
        ("http://[::1]:5000", "http://[::1]:5000"),
        ("http://127.0.0.1:5000/path?q", "http://127.0.0.1:5000"),
        ("null", None),
        ("", None),
        ("localhost", None),
        ("javascript:alert(1)", None),
        ("https://user@portal.example", None),
        ("https://portal.example:99999", None),
        ("http://[::1", None),
    ],
)
def test_canonical_origin(text, origin):
    from portal.origins import canonical_origin

    assert canonical_origin(text) == origin
