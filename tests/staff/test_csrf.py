"""Every staff form is refused without a valid CSRF token, and nothing changes."""

from __future__ import annotations

import re

import pytest

from portal.staff.models import Role
from tests.helpers import count_rows
from tests.staff.test_access_matrix import EXPECTED, _url, staff_routes

FORMS = sorted({rule for rule, method in EXPECTED if method == "POST"} | {"/staff/login"})
TABLES = (
    "staff_user",
    "staff_role",
    "staff_session",
    "staff_audit",
    "topic",
    "policy_version",
    "subscriber",
    "push_subscription",
    "consent_event",
    "topic_preference",
    "campaign",
    "campaign_draft",
    "delivery",
    "job_state",
    "job_run",
    "feedback_digest",
    "staff_test_device",
    "staff_test_send",
)


def test_csrf_protection_is_on(app):
    assert app.config.get("WTF_CSRF_ENABLED", True) is True
    assert "csrf" in app.extensions


def test_the_list_of_forms_covers_every_staff_post_route(app):
    posts = {rule for rule, method in staff_routes(app) if method == "POST"}
    assert posts | {"/staff/login"} == set(FORMS)


def _snapshot(engine):
    return {table: count_rows(engine, table) for table in TABLES}


@pytest.mark.parametrize(
    "token", [None, "forged-token", "stale"], ids=["missing", "forged", "other-session"]
)
@pytest.mark.parametrize("rule", FORMS)
def test_a_form_without_a_valid_token_is_refused(
    app, engine, admin_browser, browser, make_staff, rule, token
):
    victim = make_staff("victim@example.test", Role.CAMPAIGNS)
    if token == "stale":  # a real token, but from someone else's session
        token = browser().token()
    url = _url(rule, victim.id)
    data = {
        "email": "someone@example.test",
        "password": "correct horse battery staple",
        "roles": ["admin"],
        "current_password": "correct horse battery staple",
        "new_password": "an entirely new password",
        "confirm_password": "an entirely new password",
    }
    if token:
        data["csrf_token"] = token
    before = _snapshot(engine)
    cookie = admin_browser.cookie
    response = admin_browser.client.post(url, data=data)
    assert response.status_code == 400
    assert "This form has expired" in response.text
    assert "Nothing was changed" in response.text
    assert _snapshot(engine) == before
    assert admin_browser.cookie == cookie
    assert admin_browser.get("/staff/").status_code == 200  # still signed in


def test_the_sign_out_button_carries_a_token(app, admin_browser):
    html = admin_browser.get("/staff/").text
    form = re.search(r'<form method="post" action="/staff/logout">(.*?)</form>', html, re.S)
    assert form and 'name="csrf_token"' in form.group(1)


def test_the_token_changes_at_sign_in(app, make_staff, browser):
    make_staff("ann@example.test")
    person = browser()
    before = person.token()
    person.sign_in("ann@example.test")
    after = person.token()
    assert before != after
    refused = person.client.post(
        "/staff/password",
        data={
            "csrf_token": before,
            "current_password": "x",
            "new_password": "y",
            "confirm_password": "y",
        },
    )
    assert refused.status_code == 400
