"""Staff administration: adding staff, changing roles, disabling, the audit page."""

from __future__ import annotations

import datetime as dt
import json
import re

import sqlalchemy as sa

from portal.db import db
from portal.staff import audit
from portal.staff.models import Role, StaffUser
from tests.helpers import (
    Unchanged,
    all_rows,
    count_rows,
    error_summary,
    field_error,
    without_cell_labels,
)
from tests.staff.conftest import PASSWORD

NEW_PASSWORD = "a brand new passphrase"


def _audit(engine, action=None):
    rows = all_rows(engine, "staff_audit")
    for row in rows:
        if isinstance(row["detail"], str):
            row["detail"] = json.loads(row["detail"])
    return [r for r in rows if action is None or r["action"] == action]


def _user(app, email) -> StaffUser:
    with app.app_context():
        user = db.session.scalars(sa.select(StaffUser).where(StaffUser.email == email)).one()
        _ = user.roles
        return user


def test_an_admin_adds_a_staff_user(app, engine, admin_browser, browser):
    response = admin_browser.post(
        "/staff/admin/staff",
        {
            "email": "New.Person@Example.test",
            "roles": ["compliance", "campaigns"],
            "password": NEW_PASSWORD,
        },
    )
    assert response.status_code == 303
    page = admin_browser.get(response.location).text
    assert "Staff user new.person@example.test added." in page
    assert page.count("data-focus-on-load") == 1  # the success banner takes focus
    user = _user(app, "new.person@example.test")
    assert user.roles == {Role.COMPLIANCE, Role.CAMPAIGNS}
    assert user.password_hash.startswith("$argon2id$")
    assert NEW_PASSWORD not in json.dumps([str(r) for r in _audit(engine)])
    (created,) = [r for r in _audit(engine, "staff.created") if r["actor_email"]]
    assert created["actor_email"] == "admin@example.test"
    assert created["target"] == "staff:new.person@example.test"
    assert created["detail"] == {
        "roles": ["campaigns", "compliance"],
        "via": "console",
        "must_choose_own": True,
    }
    newcomer = browser()
    assert newcomer.sign_in("new.person@example.test", NEW_PASSWORD).status_code == 303


def test_adding_staff_shows_every_problem_in_the_error_summary(app, engine, admin_browser):
    before = count_rows(engine, "staff_user")
    response = admin_browser.post(
        "/staff/admin/staff", {"email": "not-an-email", "roles": [], "password": "short"}
    )
    assert response.status_code == 422
    html = response.text
    assert "<title>Error: Staff accounts" in html
    links = re.findall(r'<li><a href="#([\w-]+)">([^<]+)</a></li>', html)
    assert links == [
        ("email", "Enter an email address in the correct format, like name@example.com"),
        ("roles-admin", "Choose at least one role"),
        ("password", "Password must be 12 characters or more"),
    ]
    assert 'id="email" name="email" type="email" value="not-an-email"' in html
    assert 'aria-describedby="email-error" aria-invalid="true"' in html
    assert 'aria-describedby="password-hint password-error" aria-invalid="true"' in html
    assert '<fieldset aria-describedby="roles-hint roles-error">' in html
    assert "<legend>Roles</legend>" in html
    assert 'value="short"' not in html  # passwords are never echoed back
    assert count_rows(engine, "staff_user") == before


def test_an_email_can_be_used_once(app, admin_browser, make_staff):
    make_staff("ann@example.test", Role.CAMPAIGNS)
    response = admin_browser.post(
        "/staff/admin/staff",
        {"email": "ANN@example.test", "roles": ["campaigns"], "password": NEW_PASSWORD},
    )
    assert response.status_code == 422
    assert (
        '<a href="#email">A staff user with this email address already exists</a>' in response.text
    )


def test_unknown_roles_are_refused(app, admin_browser, make_staff):
    response = admin_browser.post(
        "/staff/admin/staff",
        {"email": "eve@example.test", "roles": ["superuser"], "password": NEW_PASSWORD},
    )
    assert response.status_code == 422
    assert "Choose roles from the list" in response.text


def test_an_admin_changes_roles(app, engine, admin_browser, make_staff):
    user = make_staff("ann@example.test", Role.CAMPAIGNS)
    url = f"/staff/admin/staff/{user.id}"
    response = admin_browser.post(f"{url}/roles", {"roles": ["compliance", "admin"]})
    assert response.status_code == 303
    assert response.location == url
    assert "Roles saved." in admin_browser.get(url).text
    assert _user(app, "ann@example.test").roles == {Role.ADMIN, Role.COMPLIANCE}
    (changed,) = _audit(engine, "staff.roles_changed")
    assert changed["detail"] == {"from": ["campaigns"], "to": ["admin", "compliance"]}
    assert changed["actor_email"] == "admin@example.test"
    assert changed["target"] == "staff:ann@example.test"
    # The same roles again: nothing to record.
    admin_browser.post(f"{url}/roles", {"roles": ["admin", "compliance"]})
    assert len(_audit(engine, "staff.roles_changed")) == 1


def test_roles_cannot_be_emptied(app, admin_browser, make_staff):
    user = make_staff("ann@example.test", Role.CAMPAIGNS)
    response = admin_browser.post(f"/staff/admin/staff/{user.id}/roles", {})
    assert response.status_code == 422
    assert '<a href="#roles-admin">Choose at least one role</a>' in response.text


def test_an_admin_cannot_remove_their_own_admin_role(app, engine, admin_browser):
    me = _user(app, "admin@example.test")
    response = admin_browser.post(f"/staff/admin/staff/{me.id}/roles", {"roles": ["compliance"]})
    assert response.status_code == 422
    assert "You cannot remove your own admin role" in response.text
    assert _user(app, "admin@example.test").roles == {Role.ADMIN}
    # Adding a role to oneself is allowed, and recorded.
    ok = admin_browser.post(f"/staff/admin/staff/{me.id}/roles", {"roles": ["admin", "compliance"]})
    assert ok.status_code == 303
    assert _audit(engine, "staff.roles_changed")[0]["target"] == "staff:admin@example.test"


def test_an_admin_disables_and_enables_an_account(app, engine, admin_browser, make_staff):
    user = make_staff("ann@example.test", Role.CAMPAIGNS)
    url = f"/staff/admin/staff/{user.id}"
    response = admin_browser.post(f"{url}/disable")
    assert response.status_code == 303
    page = admin_browser.get(url).text
    assert "ann@example.test is disabled." in page
    assert "Enable ann@example.test" in page
    assert _user(app, "ann@example.test").disabled_at is not None
    assert "Disabled since" in admin_browser.get("/staff/admin/staff").text
    admin_browser.post(f"{url}/enable")
    assert _user(app, "ann@example.test").disabled_at is None
    assert [r["action"] for r in _audit(engine) if r["target"] == "staff:ann@example.test"][
        -2:
    ] == ["staff.disabled", "staff.enabled"]


def test_an_admin_cannot_disable_themselves(app, engine, admin_browser):
    me = _user(app, "admin@example.test")
    unchanged = Unchanged(engine)
    # The page offers no button for it; a crafted request is refused with why, at once.
    response = admin_browser.post(f"/staff/admin/staff/{me.id}/disable")
    assert response.status_code == 409
    page = response.text
    message = "You cannot disable your own account"
    assert error_summary(page) == [("access-heading", message)]
    assert field_error(page, "access") == message
    assert f"/staff/admin/staff/{me.id}/disable" not in page  # still no button to try
    # The roles shown are the person's, not the refused request's (which posted none).
    ticked = re.findall(r'name="roles" value="(\w+)"\s*checked', page)
    assert ticked == ["admin"], ticked
    assert unchanged.changed() == []
    assert _user(app, "admin@example.test").disabled_at is None
    assert _audit(engine, "staff.disabled") == []


def test_an_unknown_staff_id_is_not_found(app, admin_browser):
    missing = "0190a000-0000-7000-8000-000000000000"
    assert admin_browser.get(f"/staff/admin/staff/{missing}").status_code == 404
    assert admin_browser.post(f"/staff/admin/staff/{missing}/disable").status_code == 404
    assert admin_browser.get("/staff/admin/staff/not-a-uuid").status_code == 404


def test_the_staff_list_is_an_accessible_table(app, admin_browser, make_staff):
    make_staff("ann@example.test", Role.CAMPAIGNS, Role.COMPLIANCE)
    html = admin_browser.get("/staff/admin/staff").text
    assert '<th scope="col">Email address</th>' in html
    assert "campaigns, compliance" in html
    assert "<legend>Roles</legend>" in html
    assert 'autocomplete="new-password"' in html


def _password_change(current: str = PASSWORD) -> dict[str, str]:
    """The password form, filled in to replace ``current`` by NEW_PASSWORD."""
    return {
        "current_password": current,
        "new_password": NEW_PASSWORD,
        "confirm_password": NEW_PASSWORD,
    }


def test_changing_ones_password(app, engine, admin_browser, browser):
    other = browser()
    other.sign_in("admin@example.test")
    wrong = admin_browser.post("/staff/password", _password_change(current="not it at all"))
    assert wrong.status_code == 422
    assert '<a href="#current_password">Your current password is wrong</a>' in wrong.text
    mismatch = admin_browser.post(
        "/staff/password",
        {"current_password": PASSWORD, "new_password": NEW_PASSWORD, "confirm_password": "other"},
    )
    assert "The new passwords do not match" in mismatch.text
    ok = admin_browser.post("/staff/password", _password_change())
    assert ok.status_code == 303
    assert admin_browser.get("/staff/").status_code == 200  # this browser stays signed in
    assert other.get("/staff/").status_code == 302  # the others are signed out
    assert browser().sign_in("admin@example.test", NEW_PASSWORD).status_code == 303
    assert len(_audit(engine, "staff.password_changed")) == 1


def test_a_password_change_ends_the_session_it_was_made_in_and_gives_a_new_one(
    app, engine, admin_browser, browser
):
    """Changing one's password is the remedy for a stolen cookie: a copy of this
    browser's cookie, taken before the change, opens nothing after it; this browser goes
    on under a new session that ends when the old one would have."""
    stolen = admin_browser.cookie
    thief = browser()
    thief.client.set_cookie("portal_staff", stolen, path="/staff")
    assert thief.get("/staff/").status_code == 200
    with engine.connect() as connection:
        (ends,) = connection.execute(sa.text("SELECT expires_at FROM staff_session")).scalars()
    ok = admin_browser.post("/staff/password", _password_change())
    assert ok.status_code == 303
    assert admin_browser.cookie not in (None, stolen)
    assert admin_browser.get("/staff/").status_code == 200
    assert thief.get("/staff/").status_code == 302
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT expires_at FROM staff_session")).scalars().all()
    assert rows == [ends]


def test_every_action_leaves_an_audit_entry(app, engine, clock, admin_browser, browser, make_staff):
    admin_browser.post(
        "/staff/admin/staff",
        {"email": "ann@example.test", "roles": ["campaigns"], "password": NEW_PASSWORD},
    )
    ann = _user(app, "ann@example.test")
    admin_browser.post(f"/staff/admin/staff/{ann.id}/roles", {"roles": ["compliance"]})
    admin_browser.post(f"/staff/admin/staff/{ann.id}/disable")
    admin_browser.post(f"/staff/admin/staff/{ann.id}/enable")
    person = browser()
    for _ in range(5):
        person.sign_in("ann@example.test", "not the password")
    clock.advance(minutes=15)
    person.sign_in("ann@example.test", NEW_PASSWORD)
    person.post("/staff/logout")
    browser().sign_in("stranger@example.test", "a guess")

    actions = {r["action"] for r in _audit(engine)}
    assert (
        set(audit.Action.ALL) - {"staff.password_changed", "staff.password_change_failed"}
        <= actions
    )
    for row in _audit(engine):
        assert row["at"] is not None
        assert row["action"]
        if row["action"] not in {"staff.locked_out", "staff.created"}:
            assert row["actor_email"], row
    stranger = _audit(engine, "staff.sign_in_failed")[-1]
    assert stranger["actor_id"] is None
    assert stranger["actor_email"] == "stranger@example.test"
    assert stranger["detail"] == {"reason": "unknown_email"}


def _fill_audit(app, clock, count):
    """One entry an hour from 01:00 on the clock's day (the signed-in admin's session
    would not survive moving the clock itself that far)."""
    start = clock.now()
    with app.app_context(), db.begin() as session:
        for index in range(count):
            action = "staff.signed_in" if index % 2 else "staff.signed_out"
            audit.record(
                session,
                audit.Anonymous(f"p{index % 3}@example.test"),
                action,
                f"thing:{index}",
                at=start + dt.timedelta(hours=index + 1),
            )


def _targets(html):
    return [int(t) for t in re.findall(r"<td>thing:(\d+)</td>", without_cell_labels(html))]


def test_the_audit_trail_pages_by_keyset(app, clock, admin_browser):
    _fill_audit(app, clock, 120)
    first = admin_browser.get("/staff/admin/audit?actor=p0@example.test")
    assert first.status_code == 200
    assert _targets(first.text) == list(range(117, -1, -3))  # 40: one page
    assert 'rel="next"' not in first.text and 'rel="prev"' not in first.text

    everyone = admin_browser.get("/staff/admin/audit?action=staff.signed_out")
    evens = list(range(118, -1, -2))  # 60 entries: a page of 50, then 10
    assert _targets(everyone.text) == evens[:50]
    assert 'rel="prev"' not in everyone.text
    older = _link(everyone.text, "next")
    assert "action=staff.signed_out" in older and "before=" in older
    second = admin_browser.get(older)
    assert _targets(second.text) == evens[50:]
    assert 'rel="next"' not in second.text
    newer = _link(second.text, "prev")
    assert "after=" in newer
    assert _targets(admin_browser.get(newer).text) == evens[:50]


def _link(html, rel):
    return re.search(rf'href="([^"]+)" rel="{rel}"', html).group(1).replace("&amp;", "&")


def test_the_audit_trail_filters_by_action_actor_and_dates(app, clock, admin_browser):
    _fill_audit(app, clock, 48)  # one entry an hour on 2026-01-01 and 2026-01-02
    by_action = _targets(admin_browser.get("/staff/admin/audit?action=staff.signed_out").text)
    assert by_action and all(t % 2 == 0 for t in by_action)
    one_day = admin_browser.get("/staff/admin/audit?date_from=2026-01-02&date_to=2026-01-02")
    assert _targets(one_day.text) == list(range(46, 22, -1))
    both = admin_browser.get(
        "/staff/admin/audit?action=staff.signed_in&actor=P1@example.test&date_to=2026-01-01"
    )
    assert _targets(both.text) == [t for t in range(22, -1, -1) if t % 2 and t % 3 == 1]


def test_bad_audit_filters_are_explained(app, admin_browser):
    response = admin_browser.get(
        "/staff/admin/audit?date_from=2026-02-30&date_to=2026-01-01&action=nope"
    )
    assert response.status_code == 422
    links = re.findall(r'<li><a href="#([\w-]+)">([^<]+)</a></li>', response.text)
    assert links == [
        ("action", "Choose an action from the list"),
        ("date_from", "From must be a real date, like 2026-03-27"),
    ]
    backwards = admin_browser.get("/staff/admin/audit?date_from=2026-03-02&date_to=2026-03-01")
    assert "To must be the same as or after From" in backwards.text


def test_staff_pages_have_no_inline_script_or_style(app, admin_browser, browser, make_staff):
    user = make_staff("ann@example.test", Role.CAMPAIGNS)
    htmls = {"/staff/login": browser().get("/staff/login").text}
    pages = [
        "/staff/",
        "/staff/password",
        "/staff/admin/staff",
        f"/staff/admin/staff/{user.id}",
        "/staff/admin/audit",
    ]
    htmls.update({url: admin_browser.get(url).text for url in pages})
    for url, html in htmls.items():
        assert "</html>" in html, url
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), url
        assert not re.search(r"\sstyle=", html), url
        assert not re.search(r"\son[a-z]+=", html), url
        assert "<style" not in html, url
