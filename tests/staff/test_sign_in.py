"""Signing in and out: lockout, throttling, sessions, cookies, and what the page says."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from pathlib import Path
from urllib.parse import quote

import pytest
import sqlalchemy as sa

from portal.config import StaffAuthSettings
from portal.seams import current_portal
from portal.staff.models import Role
from portal.staff.passwords import Passwords
from tests.helpers import all_rows, count_rows
from tests.staff.conftest import FAST_HASHER, PASSWORD

WRONG = "Email or password is wrong"


def _audit(engine, action=None):
    rows = all_rows(engine, "staff_audit")
    for row in rows:
        if isinstance(row["detail"], str):  # SQLite hands JSON back as text
            row["detail"] = json.loads(row["detail"])
    return [r for r in rows if action is None or r["action"] == action]


def test_sign_in_starts_a_session_and_lands_on_the_dashboard(app, engine, make_staff, browser):
    user = make_staff("ann@example.test", Role.COMPLIANCE)
    person = browser()
    response = person.sign_in("  Ann@Example.TEST ")  # case and spaces do not matter
    assert response.status_code == 303
    assert response.location == "/staff/"
    assert person.get("/staff/").status_code == 200
    (row,) = all_rows(engine, "staff_session")
    # Only the token's hash is stored.
    assert bytes(row["id"]) == hashlib.sha256(person.cookie.encode()).digest()
    assert person.cookie.encode() not in bytes(row["id"])
    with engine.connect() as conn:
        last = conn.execute(sa.text("SELECT last_login_at FROM staff_user")).scalar_one()
    assert last is not None
    (signed_in,) = _audit(engine, "staff.signed_in")
    assert signed_in["actor_id"] in {user.id, str(user.id), user.id.hex}
    assert signed_in["actor_email"] == "ann@example.test"


def test_the_cookie_is_httponly_lax_and_scoped_to_staff_pages(app, make_staff, browser):
    make_staff("ann@example.test")
    response = browser().sign_in("ann@example.test")
    (cookie,) = [c for c in response.headers.getlist("Set-Cookie") if c.startswith("portal_staff=")]
    assert "HttpOnly" in cookie
    assert "SameSite=Lax" in cookie
    assert "Path=/staff" in cookie
    assert "Secure" not in cookie  # plain http in development


def test_the_cookie_is_secure_over_https(app, make_staff, browser):
    make_staff("ann@example.test")
    response = browser(base_url="https://localhost").sign_in("ann@example.test")
    cookie = next(c for c in response.headers.getlist("Set-Cookie") if "portal_staff=" in c)
    assert "; Secure" in cookie


def test_the_cookie_is_secure_in_production(make_app, make_staff, browser):
    production = make_app(env="production")
    make_staff("ann@example.test")
    response = browser(production).sign_in("ann@example.test")
    cookie = next(c for c in response.headers.getlist("Set-Cookie") if "portal_staff=" in c)
    assert "; Secure" in cookie


def test_a_new_token_at_every_sign_in_and_the_old_one_stops_working(
    app, engine, make_staff, browser
):
    make_staff("ann@example.test")
    person = browser()
    person.sign_in("ann@example.test")
    first = person.cookie
    assert person.sign_in("ann@example.test").status_code == 303  # again, same browser
    second = person.cookie
    assert first and second and first != second
    assert count_rows(engine, "staff_session") == 1  # the browser's old session is gone
    stolen = browser()
    stolen.client.set_cookie("portal_staff", first, path="/staff")
    assert stolen.get("/staff/").status_code == 302


def test_an_anonymous_cookie_is_replaced_at_sign_in(app, make_staff, browser):
    make_staff("ann@example.test")
    person = browser()
    person.client.set_cookie("portal_staff", "planted-by-someone-else", path="/staff")
    person.sign_in("ann@example.test")
    assert person.cookie != "planted-by-someone-else"


def test_sign_out_deletes_the_session(app, engine, make_staff, browser):
    make_staff("ann@example.test")
    person = browser()
    person.sign_in("ann@example.test")
    token = person.cookie
    response = person.post("/staff/logout")
    assert response.status_code == 303
    assert response.location == "/staff/login"
    assert person.cookie is None
    assert count_rows(engine, "staff_session") == 0
    assert "You have signed out." in person.get("/staff/login").text
    replay = browser()
    replay.client.set_cookie("portal_staff", token, path="/staff")
    assert replay.get("/staff/").status_code == 302
    assert len(_audit(engine, "staff.signed_out")) == 1


def test_sign_out_is_post_only(app, make_staff, browser):
    make_staff("ann@example.test")
    person = browser()
    person.sign_in("ann@example.test")
    assert person.get("/staff/logout").status_code == 405
    assert person.get("/staff/").status_code == 200


def test_idle_sessions_expire(app, engine, clock, make_staff, browser):
    make_staff("ann@example.test")
    person = browser()
    person.sign_in("ann@example.test")
    for _ in range(3):  # activity keeps it alive past the idle limit
        clock.advance(minutes=29)
        assert person.get("/staff/").status_code == 200
    clock.advance(minutes=30)
    response = person.get("/staff/")
    assert response.status_code == 302
    assert response.location.startswith("/staff/login")
    assert person.cookie is None  # the dead cookie is cleared
    assert count_rows(engine, "staff_session") == 0


def test_sessions_end_at_the_absolute_limit_however_active(app, clock, make_staff, browser):
    make_staff("ann@example.test")
    person = browser()
    person.sign_in("ann@example.test")
    for _ in range(12 * 4 - 1):
        clock.advance(minutes=15)
        assert person.get("/staff/").status_code == 200
    clock.advance(minutes=15)  # 12 hours after sign-in
    assert person.get("/staff/").status_code == 302


def test_session_limits_come_from_settings(make_app, clock, make_staff, browser):
    short = make_app(staff=StaffAuthSettings(session_idle_minutes=5, attempts_per_minute=100))
    make_staff("ann@example.test")
    person = browser(short)
    person.sign_in("ann@example.test")
    clock.advance(minutes=4)
    assert person.get("/staff/").status_code == 200
    clock.advance(minutes=5)
    assert person.get("/staff/").status_code == 302


def test_wrong_password_and_unknown_email_get_the_same_answer(app, make_staff, browser):
    make_staff("ann@example.test")
    wrong_password = browser().sign_in("ann@example.test", "not the password at all")
    unknown_email = browser().sign_in("nobody@example.test", "not the password at all")
    for response in (wrong_password, unknown_email):
        assert response.status_code == 401
        assert WRONG in response.text
        assert response.text.count("data-focus-on-load") == 1
        assert "<title>Error: Sign in" in response.text
        assert '<a href="#email">Email or password is wrong</a>' in response.text


def test_unknown_emails_are_checked_against_a_dummy_hash(app, make_staff, browser):
    calls = []

    class Spy(Passwords):
        def verify(self, stored_hash, password):
            calls.append(stored_hash)
            return super().verify(stored_hash, password)

    current_portal(app).passwords = Spy(FAST_HASHER)
    make_staff("ann@example.test")
    browser().sign_in("nobody@example.test", "whatever it may be")
    browser().sign_in("ann@example.test", "whatever it may be")
    assert len(calls) == 2
    assert calls[0] is None  # verified against the dummy hash
    assert calls[1].startswith("$argon2id$")


def test_lockout_after_five_failures_and_unlock_after_fifteen_minutes(
    app, engine, clock, make_staff, browser
):
    make_staff("ann@example.test")
    person = browser()
    for _ in range(4):
        response = person.sign_in("ann@example.test", "wrong password here")
        assert response.status_code == 401
        assert WRONG in response.text
    fifth = person.sign_in("ann@example.test", "wrong password here")
    assert fifth.status_code == 429
    assert "Too many attempts: try again in 15 minutes" in fifth.text
    assert fifth.headers["Retry-After"]
    # Locked: even the right password is refused, and the wait does not grow.
    right = person.sign_in("ann@example.test", PASSWORD)
    assert right.status_code == 429
    assert person.cookie is None
    clock.advance(minutes=10, seconds=30)
    assert "try again in 5 minutes" in person.sign_in("ann@example.test", PASSWORD).text
    clock.advance(minutes=4)
    assert "try again in 1 minute<" in person.sign_in("ann@example.test", PASSWORD).text
    clock.advance(seconds=30)
    assert person.sign_in("ann@example.test", PASSWORD).status_code == 303
    assert person.get("/staff/").status_code == 200

    with engine.connect() as conn:
        failed, locked = conn.execute(
            sa.text("SELECT failed_logins, locked_until FROM staff_user")
        ).one()
    assert (failed, locked) == (0, None)
    reasons = [r["detail"]["reason"] for r in _audit(engine, "staff.sign_in_failed")]
    assert reasons == ["wrong_password"] * 5 + ["locked"] * 3
    (lockout,) = _audit(engine, "staff.locked_out")
    assert lockout["target"] == "staff:ann@example.test"
    assert lockout["actor_id"] is None


def test_unknown_emails_lock_out_the_same_way(app, clock, browser):
    person = browser()
    statuses = [person.sign_in("nobody@example.test", "guess").status_code for _ in range(6)]
    assert statuses == [401, 401, 401, 401, 429, 429]
    clock.advance(minutes=15)
    assert person.sign_in("nobody@example.test", "guess").status_code == 401


def test_a_success_clears_the_failure_count(app, make_staff, browser):
    make_staff("ann@example.test")
    person = browser()
    for _ in range(4):
        person.sign_in("ann@example.test", "wrong password here")
    assert person.sign_in("ann@example.test").status_code == 303
    for _ in range(4):
        assert person.sign_in("ann@example.test", "wrong password here").status_code == 401


def test_lockout_settings_are_configurable(make_app, clock, make_staff, browser):
    strict = make_app(
        staff=StaffAuthSettings(lockout_attempts=2, lockout_minutes=60, attempts_per_minute=100)
    )
    make_staff("ann@example.test")
    person = browser(strict)
    assert person.sign_in("ann@example.test", "wrong password here").status_code == 401
    second = person.sign_in("ann@example.test", "wrong password here")
    assert "try again in 60 minutes" in second.text


def test_attempts_per_client_address_are_limited(make_app, clock, make_staff, browser):
    limited = make_app(staff=StaffAuthSettings(attempts_per_minute=3))
    make_staff("ann@example.test")
    here = browser(limited)
    for email in ("a@example.test", "b@example.test", "c@example.test"):
        assert here.sign_in(email, "guess").status_code == 401
    refused = here.sign_in("ann@example.test")  # even the right password, for now
    assert refused.status_code == 429
    assert "Too many attempts: try again in 1 minute" in refused.text
    assert here.cookie is None
    elsewhere = browser(limited, remote_addr="192.0.2.7")
    assert elsewhere.sign_in("ann@example.test").status_code == 303
    clock.advance(minutes=1)
    assert here.sign_in("ann@example.test").status_code == 303


def test_the_throttle_stores_no_address_or_email_in_the_clear(app, engine, make_staff, browser):
    browser(remote_addr="198.51.100.23").sign_in("nobody@example.test", "x")
    rows = all_rows(engine, "staff_login_throttle")
    assert {r["kind"] for r in rows} == {"address", "email"}
    for row in rows:
        assert b"198.51.100.23" not in bytes(row["key"])
        assert len(bytes(row["key"])) == 32


def _page_answer(response) -> tuple[int, str]:
    """What a sign-in answer tells the person: its status and its error summary."""
    summary = re.search(r'<div class="error-summary".*?</div>', response.text, re.S)
    return response.status_code, summary.group(0) if summary else ""


def test_a_disabled_account_answers_the_same_for_a_right_and_a_wrong_password(
    app, engine, make_staff, browser
):
    calls = []

    class Spy(Passwords):
        def verify(self, stored_hash, password):
            calls.append(stored_hash)
            return super().verify(stored_hash, password)

    current_portal(app).passwords = Spy(FAST_HASHER)
    make_staff("gone@example.test", disabled=True)
    make_staff("here@example.test")
    wrong = browser().sign_in("gone@example.test", "wrong password here")
    right = browser().sign_in("gone@example.test")
    enabled_wrong = browser().sign_in("here@example.test", "wrong password here")
    # No oracle: the right password of a disabled account reads as any wrong password.
    assert _page_answer(right) == _page_answer(wrong) == _page_answer(enabled_wrong)
    assert right.status_code == 401
    assert WRONG in right.text
    assert "disabled" not in right.text
    assert count_rows(engine, "staff_session") == 0
    # The stored hash is verified either way, so the time taken does not tell either.
    assert len(calls) == 3 and all(h and h.startswith("$argon2id$") for h in calls)
    reasons = [r["detail"]["reason"] for r in _audit(engine, "staff.sign_in_failed")]
    assert reasons == ["wrong_password", "disabled", "wrong_password"]  # staff still see why


def test_a_disabled_account_locks_out_like_any_other(app, make_staff, browser):
    make_staff("gone@example.test", disabled=True)
    person = browser()
    statuses = [
        person.sign_in(
            "gone@example.test", PASSWORD if i % 2 else "wrong password here"
        ).status_code
        for i in range(6)
    ]
    assert statuses == [401, 401, 401, 401, 429, 429]


def test_a_wrong_current_password_counts_toward_the_lockout(
    app, engine, clock, admin_browser, browser
):
    new = "a brand new password for me"
    for _ in range(4):
        wrong = admin_browser.post(
            "/staff/password",
            {"current_password": "not it at all", "new_password": new, "confirm_password": new},
        )
        assert wrong.status_code == 422
        assert "Your current password is wrong" in wrong.text
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT failed_logins FROM staff_user")).scalar_one() == 4
    # The fifth wrong attempt, here at sign-in, locks the account: one count for both doors.
    locked = browser().sign_in("admin@example.test", "wrong password here")
    assert locked.status_code == 429
    assert browser().sign_in("admin@example.test").status_code == 429
    # While locked, the form does not check passwords either, not even the right one.
    refused = admin_browser.post(
        "/staff/password",
        {"current_password": PASSWORD, "new_password": new, "confirm_password": new},
    )
    assert refused.status_code == 429
    assert "Too many attempts: try again in 15 minutes" in refused.text
    assert browser().sign_in("admin@example.test", new).status_code == 429
    reasons = [r["detail"].get("reason") for r in _audit(engine, "staff.password_change_failed")]
    assert reasons == ["wrong_password"] * 4 + ["locked"]
    clock.advance(minutes=15)
    assert browser().sign_in("admin@example.test").status_code == 303


def test_the_password_form_locks_the_account_on_the_last_allowed_attempt(
    app, engine, clock, admin_browser, browser
):
    new = "a brand new password for me"
    answers = [
        admin_browser.post(
            "/staff/password",
            {"current_password": "not it at all", "new_password": new, "confirm_password": new},
        ).status_code
        for _ in range(6)
    ]
    assert answers == [422, 422, 422, 422, 429, 429]
    assert len(_audit(engine, "staff.locked_out")) == 1
    assert browser().sign_in("admin@example.test").status_code == 429
    clock.advance(minutes=15)
    ok = admin_browser.post(
        "/staff/password",
        {"current_password": PASSWORD, "new_password": new, "confirm_password": new},
    )
    assert ok.status_code == 303  # still signed in here (sessions are not ended by a lock)
    with engine.connect() as conn:
        failed, locked = conn.execute(
            sa.text("SELECT failed_logins, locked_until FROM staff_user")
        ).one()
    assert (failed, locked) == (0, None)  # a right current password clears the count


def test_form_errors_use_the_error_summary(app, browser):
    person = browser()
    response = person.client.post(
        "/staff/login", data={"csrf_token": person.token(), "email": "", "password": ""}
    )
    assert response.status_code == 422
    html = response.text
    assert "<title>Error: Sign in" in html
    assert html.index('href="#email"') < html.index('href="#password"')
    assert 'aria-describedby="email-error" aria-invalid="true"' in html
    assert 'id="email-error"' in html and "Enter your email address" in html
    assert "Enter your password" in html


def test_the_sign_in_page_allows_paste_and_autofill(app, browser):
    html = browser().get("/staff/login").text
    assert 'autocomplete="username"' in html
    assert 'autocomplete="current-password"' in html
    assert 'type="email"' in html and 'type="password"' in html
    for blocker in ("onpaste", "oncopy", "oncut", "ondrop", "readonly"):
        assert blocker not in html


def test_every_password_field_allows_paste_and_a_password_manager(app, browser, admin_browser):
    """WCAG 3.3.8: nothing on a page with a password field blocks pasting into it, and
    each field tells a password manager what it is for."""
    pages = {
        "/staff/login": browser().get("/staff/login").text,
        "/staff/password": admin_browser.get("/staff/password").text,
        "/staff/admin/staff": admin_browser.get("/staff/admin/staff").text,
    }
    scripts: set[str] = set()
    for url, html in pages.items():
        fields = re.findall(r'<input[^>]*type="password"[^>]*>', html)
        assert fields, url
        for field in fields:
            for blocker in ("onpaste", "oncopy", "oncut", "ondrop", "readonly", "disabled"):
                assert blocker not in field, (url, field)
            assert re.search(r'autocomplete="(current|new)-password"', field), (url, field)
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), url  # no inline script
        scripts |= set(re.findall(r'<script[^>]*\bsrc="/static/([^"?]+)', html))
    assert scripts  # the pages' own scripts (focus handling …) are read below
    for name in scripts:  # nor does any script those pages load
        source = (Path(app.static_folder) / name).read_text(encoding="utf-8")
        for event in ("paste", "copy", "cut", "drop"):
            assert f'"{event}"' not in source and f"'{event}'" not in source, (name, event)
            assert f"on{event}" not in source, (name, event)


@pytest.mark.parametrize(
    "next_path",
    ["/staff/admin/audit?action=staff.created", "/staff/password"],
)
def test_sign_in_returns_to_the_page_asked_for(app, make_staff, browser, next_path):
    make_staff("ann@example.test")
    person = browser()
    first = person.get(next_path)
    assert first.status_code == 302
    login_url = first.location
    response = person.post(login_url, {"email": "ann@example.test", "password": PASSWORD})
    assert response.status_code == 303
    assert response.location == next_path


@pytest.mark.parametrize(
    "next_path",
    [
        "https://evil.example/",
        "//evil.example/",
        "/\\evil.example",
        "\\\\evil.example",
        "javascript:alert(1)",
        "http:/evil.example",
        " //evil.example",
        "evil.example",
    ],
)
def test_sign_in_never_redirects_off_site(app, make_staff, browser, next_path):
    make_staff("ann@example.test")
    response = browser().sign_in("ann@example.test", next_path=quote(next_path, safe=""))
    assert response.status_code == 303
    assert response.location == "/staff/"


@pytest.mark.parametrize("next_path", ["/\t/evil.example", "/staff/\r\nSet-Cookie:x=1"])
def test_a_next_with_a_control_character_is_a_bad_request(app, make_staff, browser, next_path):
    """Browsers drop tabs and line breaks from URLs, so "/\t/evil.example" opens
    another site: such an address is refused outright, before anyone signs in."""
    make_staff("ann@example.test")
    person = browser()
    response = person.sign_in("ann@example.test", next_path=quote(next_path, safe=""))
    assert response.status_code == 400
    assert person.cookie is None


def test_a_signed_in_visit_to_the_sign_in_page_goes_to_the_dashboard(app, make_staff, browser):
    make_staff("ann@example.test")
    person = browser()
    person.sign_in("ann@example.test")
    response = person.get("/staff/login?next=//evil.example")
    assert response.status_code == 302
    assert response.location == "/staff/"


def test_disabling_ends_the_sessions_at_once(app, clock, make_staff, browser, admin_browser):
    victim = make_staff("ann@example.test", Role.CAMPAIGNS)
    person = browser()
    person.sign_in("ann@example.test")
    assert person.get("/staff/").status_code == 200
    admin_browser.post(f"/staff/admin/staff/{victim.id}/disable")
    assert person.get("/staff/").status_code == 302


def test_role_changes_apply_to_open_sessions(app, make_staff, browser, admin_browser):
    user = make_staff("ann@example.test", Role.CAMPAIGNS)
    person = browser()
    person.sign_in("ann@example.test")
    assert person.get("/staff/admin/audit").status_code == 403
    admin_browser.post(f"/staff/admin/staff/{user.id}/roles", {"roles": ["compliance"]})
    assert person.get("/staff/admin/audit").status_code == 200


def test_staff_pages_are_never_cached(app, admin_browser):
    assert admin_browser.get("/staff/").headers["Cache-Control"] == "no-store"
    assert admin_browser.get("/staff/login").headers["Cache-Control"] == "no-store"


def test_expired_sessions_are_purged_at_the_next_sign_in(app, engine, clock, make_staff, browser):
    make_staff("ann@example.test")
    for _ in range(3):
        browser().sign_in("ann@example.test")
    assert count_rows(engine, "staff_session") == 3
    clock.advance(dt.timedelta(hours=13))
    browser().sign_in("ann@example.test")
    assert count_rows(engine, "staff_session") == 1
