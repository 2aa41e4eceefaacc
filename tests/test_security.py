"""Security headers on every response, request size limits, error pages without detail."""

from __future__ import annotations

import io
import json
import logging
import uuid
from pathlib import Path

import pytest
from flask import Flask
from werkzeug.test import EnvironBuilder, run_wsgi_app

from portal import create_app
from portal.api import ERROR_PAGES, error_page
from portal.clock import FrozenClock
from portal.seams import current_portal
from portal.security import CONTENT_SECURITY_POLICY, HSTS, security_headers
from portal.staff.models import Role
from tests.conftest import make_settings
from tests.helpers import chunked_environ
from tests.staff.conftest import FAST_HASHER, GENEROUS, Browser

EXPECTED = security_headers(production=False)
SAMPLE_VALUES = {"filename": "css/portal.css", "version": "2026-01", "slug": "offers"}


def _get_urls(app: Flask) -> list[str]:
    """A concrete address for every GET route in the URL map."""
    urls = []
    for rule in app.url_map.iter_rules():
        if "GET" not in (rule.methods or set()):
            continue
        values = {}
        for name in rule.arguments:
            converter = rule._converters[name]
            is_uuid = type(converter).__name__ == "UUIDConverter"
            values[name] = uuid.uuid4() if is_uuid else SAMPLE_VALUES.get(name, "x")
        with app.test_request_context():
            from flask import url_for

            urls.append(url_for(rule.endpoint, **values))
    return urls


def _assert_secured(response, url: str) -> None:
    for name, value in EXPECTED.items():
        assert response.headers.get(name) == value, f"{url} ({response.status_code}): {name}"
    assert "Strict-Transport-Security" not in response.headers, url


@pytest.fixture
def staff_browser(app: Flask) -> Browser:
    from portal.db import db
    from portal.staff import services
    from portal.staff.passwords import Passwords

    passwords = Passwords(FAST_HASHER)
    current_portal(app).passwords = passwords
    with app.app_context(), db.begin() as session:
        services.create_staff(
            session,
            email="all@example.test",
            password="a long enough staff password",
            roles=tuple(Role),
            actor=None,
            passwords=passwords,
            now=current_portal(app).clock.now(),
            via="test",
            must_replace_password=False,
        )
    person = Browser(app.test_client())
    assert person.sign_in("all@example.test", "a long enough staff password").status_code == 303
    return person


@pytest.fixture
def settings(database_url: str, tmp_path: Path):
    return make_settings(database_url, str(tmp_path / "instance"), staff=GENEROUS)


def test_every_get_route_carries_the_security_headers(catalogue_ready, client, staff_browser):
    urls = _get_urls(catalogue_ready)
    assert "/sw.js" in urls
    assert "/static/css/portal.css" in urls
    statuses = set()
    for url in urls:
        for get in (client.get, staff_browser.get):
            with get(url) as response:  # closes static files
                _assert_secured(response, url)
                statuses.add(response.status_code)
    # Pages, redirects to sign-in and missing things all answered, all with headers.
    assert {200, 302, 404} <= statuses


def test_posts_errors_and_unknown_addresses_carry_the_headers(client):
    responses = {
        "api": client.post("/api/push/heartbeat", json={}),
        "api-wrong-type": client.post("/api/push/heartbeat", data="x"),
        "form-without-csrf": client.post("/preferences", data={}),
        "unknown": client.get("/no/such/page"),
        "wrong-method": client.delete("/"),
    }
    for name, response in responses.items():
        assert response.status_code >= 400, name
        _assert_secured(response, name)


def test_the_service_worker_keeps_its_own_headers(client):
    with client.get("/sw.js") as response:
        pass
    assert response.status_code == 200
    assert response.headers["Service-Worker-Allowed"] == "/"
    assert response.headers["Content-Type"].startswith("text/javascript")
    _assert_secured(response, "/sw.js")


def test_the_content_security_policy_allows_nothing_inline():
    directives = {
        name: value
        for name, _, value in (part.partition(" ") for part in CONTENT_SECURITY_POLICY.split("; "))
    }
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    assert "unsafe-eval" not in CONTENT_SECURITY_POLICY
    assert directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'"
    assert directives["connect-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"


def test_templates_have_no_inline_scripts_or_styles():
    root = Path(__file__).resolve().parent.parent / "templates"
    for template in root.rglob("*.html"):
        text = template.read_text()
        assert "style=" not in text, template
        assert "<style" not in text, template
        for line in text.splitlines():
            if "<script" in line:
                assert " src=" in line, f"{template}: inline script"


def test_hsts_only_in_production(database_url: str, tmp_path: Path, clock: FrozenClock, client):
    assert "Strict-Transport-Security" not in client.get("/healthz").headers
    production = create_app(
        make_settings(database_url, str(tmp_path / "prod"), env="production"), clock=clock
    )
    try:
        response = production.test_client().get("/healthz", base_url="https://localhost")
        assert response.headers["Strict-Transport-Security"] == HSTS
        assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    finally:
        production.extensions["portal.db"].engine.dispose()


# Request size ---------------------------------------------------------------------------


@pytest.fixture
def small_bodies(database_url: str, tmp_path: Path, clock: FrozenClock):
    application = create_app(
        make_settings(
            database_url, str(tmp_path / "instance"), max_body_bytes=4096, api_max_body_bytes=1024
        ),
        clock=clock,
    )
    yield application
    application.extensions["portal.db"].engine.dispose()


def test_an_oversized_form_gets_a_plain_error_page(small_bodies: Flask):
    response = small_bodies.test_client().post(
        "/preferences", data={"csrf_token": "x", "filler": "a" * 10_000}
    )
    assert response.status_code == 413
    assert response.mimetype == "text/html"
    assert "<h1>Request too large</h1>" in response.text
    assert "Traceback" not in response.text
    _assert_secured(response, "/preferences")


def test_an_oversized_api_body_gets_a_json_error(small_bodies: Flask):
    response = small_bodies.test_client().post(
        "/api/push/heartbeat", json={"endpoint": "https://fcm.googleapis.com/" + "a" * 2000}
    )
    assert response.status_code == 413
    assert response.json["error"]["code"] == "request_entity_too_large"
    _assert_secured(response, "/api/push/heartbeat")


def _sent(app: Flask, path: str, body: bytes, *, chunked: bool) -> tuple[int, bytes]:
    """``body`` sent to ``path``: with a Content-Length, or chunked as gunicorn hands a
    chunked body on."""
    headers = {"Content-Type": "application/json"}
    if chunked:
        environ = chunked_environ(path, body, headers)
    else:
        environ = EnvironBuilder(
            path=path,
            method="POST",
            input_stream=io.BytesIO(body),
            headers=headers,
            content_length=len(body),
        ).get_environ()
    answer, status, _ = run_wsgi_app(app.wsgi_app, environ)
    return int(status.split()[0]), b"".join(answer)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_refused_however_it_is_sent(small_bodies: Flask, chunked):
    """Its first 1,024 bytes are a whole request; the rest must not be cut off unread
    and the first part acted on."""
    head = b'{"endpoint": "https://fcm.googleapis.com/fcm/send/abc"}'
    body = head + b" " * (1024 - len(head)) + b"and a tail"
    status, answer = _sent(small_bodies, "/api/push/heartbeat", body, chunked=chunked)
    assert status == 413
    assert json.loads(answer)["error"]["code"] == "request_entity_too_large"


@pytest.mark.parametrize("size", [1023, 1024])
def test_a_chunked_body_within_the_limit_is_read_whole(small_bodies: Flask, size):
    head = b'{"endpoint": "https://fcm.googleapis.com/fcm/send/abc"}'
    body = head + b" " * (size - len(head))
    status, answer = _sent(small_bodies, "/api/push/heartbeat", body, chunked=True)
    assert (status, json.loads(answer)) == (200, {"action": "unsubscribe", "state": "unknown"})


def test_a_chunked_form_over_the_limit_is_refused_before_it_is_parsed(small_bodies: Flask):
    environ = chunked_environ(
        "/preferences",
        b"csrf_token=x&filler=" + b"a" * 10_000,
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    answer, status, _ = run_wsgi_app(small_bodies.wsgi_app, environ)
    assert status.startswith("413")
    assert "<h1>Request too large</h1>" in b"".join(answer).decode()


def test_the_global_limit_is_the_app_setting(small_bodies: Flask, app: Flask):
    assert small_bodies.config["MAX_CONTENT_LENGTH"] == 4096
    assert app.config["MAX_CONTENT_LENGTH"] == 1024 * 1024


# Error pages ----------------------------------------------------------------------------

SECRET_IN_MESSAGE = "database password is hunter2-do-not-show"


@pytest.fixture
def production(database_url: str, tmp_path: Path, clock: FrozenClock):
    application = create_app(
        make_settings(database_url, str(tmp_path / "prod"), env="production"), clock=clock
    )

    @application.get("/explode")
    def explode() -> str:
        raise RuntimeError(SECRET_IN_MESSAGE)

    @application.get("/api/push/explode")
    def explode_api() -> str:
        raise RuntimeError(SECRET_IN_MESSAGE)

    yield application
    application.extensions["portal.db"].engine.dispose()


def _shows_nothing_inside(text: str, app: Flask) -> None:
    settings = current_portal(app).settings
    for forbidden in (
        "Traceback",
        "RuntimeError",
        SECRET_IN_MESSAGE,
        "hunter2",
        'File "',
        settings.secret_key,
        settings.vapid_private_key,
        settings.export_signing_key,
    ):
        assert forbidden not in text


def test_a_crash_in_production_shows_a_plain_page_and_is_logged(production: Flask, caplog):
    client = production.test_client()
    with caplog.at_level(logging.ERROR, logger="portal"):
        response = client.get("/explode", base_url="https://localhost")
    assert response.status_code == 500
    assert "<h1>Something went wrong</h1>" in response.text
    _shows_nothing_inside(response.text, production)
    assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[1] is not None]
    assert logged, "the exception was not logged"
    assert SECRET_IN_MESSAGE in str(logged[0].exc_info[1])


def test_a_crash_in_the_api_answers_json_without_detail(production: Flask, caplog):
    client = production.test_client()
    with caplog.at_level(logging.ERROR, logger="portal"):
        response = client.get("/api/push/explode", base_url="https://localhost")
    assert response.status_code == 500
    assert response.json["error"]["code"] == "internal_server_error"
    _shows_nothing_inside(response.text, production)
    assert any(r.exc_info for r in caplog.records)


@pytest.mark.parametrize(
    ("method", "path", "status", "title"),
    [
        ("get", "/no/such/page", 404, "Page not found"),
        ("delete", "/", 405, "Method not allowed"),
        ("get", "/policy/no-such-version", 404, "Page not found"),
        ("post", "/preferences", 400, "Bad request"),
    ],
)
def test_error_pages_are_the_portal_s_own(production: Flask, method, path, status, title):
    response = getattr(production.test_client(), method)(path, base_url="https://localhost")
    assert response.status_code == status
    assert f"<h1>{title}</h1>" in response.text
    assert f"<title>{title} – Push consent portal</title>" in response.text
    _shows_nothing_inside(response.text, production)
    if status == 405:
        assert "GET" in response.headers["Allow"]


def test_statuses_without_their_own_page_keep_their_code(production: Flask):
    with production.test_request_context():
        gone = error_page(410)
        unavailable = error_page(503)
    assert gone.status_code == 410
    assert f"<h1>{ERROR_PAGES[400][0]}</h1>" in gone.get_data(as_text=True)
    assert unavailable.status_code == 503
    assert f"<h1>{ERROR_PAGES[500][0]}</h1>" in unavailable.get_data(as_text=True)


def test_api_errors_stay_json(client):
    response = client.get("/api/push/no-such-thing")
    assert response.status_code == 404
    assert response.json["error"]["code"] == "not_found"
    response = client.get("/api/push/subscribe")
    assert response.status_code == 405
    assert response.json["error"]["code"] == "method_not_allowed"
    assert "POST" in response.headers["Allow"]


def test_every_page_under_preferences_is_never_stored(catalogue_ready, client, subscriptions):
    """The preference centre, its states, the account link and erasure pages show a
    person's choices: no shared cache or back button keeps a copy."""
    urls = [url for url in _get_urls(catalogue_ready) if url.startswith("/preferences")]
    assert {"/preferences", "/preferences/erase", "/preferences/link"} <= set(urls)
    subscribed = catalogue_ready.test_client()
    answer = subscribed.post(
        "/api/push/subscribe", json={"subscription": subscriptions().to_json()}
    )
    assert answer.status_code == 201
    assert answer.headers.get("Cache-Control") == "no-store"  # the API answers with state too
    for url in urls:
        for visitor in (client, subscribed):
            with visitor.get(url) as response:
                assert response.headers.get("Cache-Control") == "no-store", (
                    f"{url} ({response.status_code})"
                )


def test_a_persons_pages_and_downloads_are_never_stored(
    catalogue_ready, client, engine, subscriptions, staff_browser
):
    import re

    import sqlalchemy as sa

    from tests.helpers import csrf_token

    sub = subscriptions()
    assert (
        client.post("/api/push/subscribe", json={"subscription": sub.to_json()}).status_code == 201
    )
    choices = client.post(
        "/api/push/preferences",
        json={
            "endpoint": sub.endpoint,
            "decisions": [{"slug": "offers", "state": "opt_in"}],
            "policyVersion": "v1",
            "decidedAt": "2025-12-31T23:00:00Z",
        },
    )
    centre = client.get("/preferences")
    with engine.connect() as conn:
        subscriber_id = uuid.UUID(
            str(conn.execute(sa.text("SELECT id FROM subscriber")).scalar_one())
        )
    person = staff_browser.get(f"/staff/compliance/subscribers/{subscriber_id}")
    invalid_link = client.get("/preferences?token=not-a-token")
    erase_page = client.get("/preferences/erase")
    erased = client.post(
        "/preferences/erase",
        data={"csrf_token": csrf_token(erase_page.text), "confirm": "yes"},
        follow_redirects=True,
    )
    receipt_url = re.search(r'href="(/preferences/erasure-receipt/[^"]+)"', erased.text).group(1)
    receipt = client.get(receipt_url)
    lookup = staff_browser.get("/staff/compliance/lookup")
    responses = {
        "preferences API": choices,
        "preference centre": centre,
        "invalid link": invalid_link,
        "erase confirmation": erase_page,
        "staff subscriber page": person,
        "erased": erased,
        "erasure receipt download": receipt,
        "staff look-up": lookup,
    }
    for name, response in responses.items():
        assert response.status_code < 500, name
        assert response.headers.get("Cache-Control") == "no-store", name
