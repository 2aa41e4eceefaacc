"""An account whose password someone else chose (an admin in the console, or the command
line) is asked to replace it at first sign-in, and no other staff page or form works until
then: on the server, not just by a link."""

from __future__ import annotations

import json
import logging

import pytest
import sqlalchemy as sa

from portal.db import db
from portal.staff.models import Role, StaffUser
from tests.helpers import all_rows, count_rows
from tests.staff.conftest import PASSWORD

GIVEN = "the password an admin typed"
OWN = "a passphrase only I know"
EMAIL = "new.person@example.test"


def _flag(app, email: str = EMAIL) -> bool:
    with app.app_context():
        return db.session.scalars(
            sa.select(StaffUser.must_replace_password).where(StaffUser.email == email)
        ).one()


def _audit(engine, action: str) -> list[dict]:
    rows = [r for r in all_rows(engine, "staff_audit") if r["action"] == action]
    for row in rows:
        if isinstance(row["detail"], str):
            row["detail"] = json.loads(row["detail"])
    return rows


@pytest.fixture
def newcomer(app, admin_browser, browser):
    """Added by an admin through the console, with every role, not signed in yet."""
    added = admin_browser.post(
        "/staff/admin/staff",
        {"email": EMAIL, "roles": ["admin", "compliance", "campaigns"], "password": GIVEN},
    )
    assert added.status_code == 303
    assert "asked to choose a new password" in admin_browser.get(added.location).text
    assert _flag(app) is True
    return browser()


def test_an_account_an_admin_made_must_replace_its_password(app, newcomer):
    signed_in = newcomer.sign_in(EMAIL, GIVEN, next_path="/staff/admin/audit")
    assert signed_in.status_code == 303
    assert signed_in.location.endswith("/staff/password")  # not the dashboard, nor ?next
    page = newcomer.get("/staff/password")
    assert page.status_code == 200
    assert "<h1>Choose your own password</h1>" in page.text
    assert "Your password was set by someone else" in page.text
    assert "The password you were given." in page.text
    # Nothing else is offered in the navigation; signing out is.
    assert "/staff/admin/audit" not in page.text and "Staff home" not in page.text
    assert 'action="/staff/logout"' in page.text


@pytest.mark.parametrize(
    "path",
    ["/staff/", "/staff/admin/audit", "/staff/admin/staff", "/staff/campaigns", "/staff/ops/jobs"],
)
def test_every_other_staff_page_redirects_to_the_password_page(newcomer, path):
    assert newcomer.sign_in(EMAIL, GIVEN).status_code == 303
    response = newcomer.get(path)
    assert response.status_code == 303
    assert response.location.endswith("/staff/password")


def test_a_staff_form_does_nothing_until_the_password_is_replaced(app, engine, newcomer):
    assert newcomer.sign_in(EMAIL, GIVEN).status_code == 303
    staff_before = count_rows(engine, "staff_user")
    topics_before = count_rows(engine, "topic")
    added = newcomer.post(
        "/staff/admin/staff",
        {"email": "someone@example.test", "roles": ["admin"], "password": "x" * 20},
    )
    assert added.status_code == 303 and added.location.endswith("/staff/password")
    topic = newcomer.post(
        "/staff/admin/topics/new",
        {
            "slug": "sneaky",
            "category": "News",
            "label": "Sneaky",
            "topic_class": "marketing",
            "default_state": "opt_out",
        },
    )
    assert topic.status_code == 303 and topic.location.endswith("/staff/password")
    assert count_rows(engine, "staff_user") == staff_before
    assert count_rows(engine, "topic") == topics_before


def test_signing_out_still_works(engine, newcomer):
    assert newcomer.sign_in(EMAIL, GIVEN).status_code == 303
    out = newcomer.post("/staff/logout")
    assert out.status_code == 303 and out.location.endswith("/staff/login")
    assert newcomer.get("/staff/password").status_code == 302  # signed out: to sign-in
    assert _audit(engine, "staff.signed_out")


def test_the_new_password_must_differ_and_pass_the_rules(app, newcomer):
    assert newcomer.sign_in(EMAIL, GIVEN).status_code == 303
    same = newcomer.post(
        "/staff/password",
        {"current_password": GIVEN, "new_password": GIVEN, "confirm_password": GIVEN},
    )
    assert same.status_code == 422
    assert "Your new password must be different from your current one" in same.text
    short = newcomer.post(
        "/staff/password",
        {"current_password": GIVEN, "new_password": "short", "confirm_password": "short"},
    )
    assert short.status_code == 422
    assert "Password must be 12 characters or more" in short.text
    assert _flag(app) is True
    assert newcomer.get("/staff/").status_code == 303


def test_replacing_it_opens_the_console_and_is_audited(app, engine, newcomer, caplog):
    caplog.set_level(logging.DEBUG)
    assert newcomer.sign_in(EMAIL, GIVEN).status_code == 303
    changed = newcomer.post(
        "/staff/password",
        {"current_password": GIVEN, "new_password": OWN, "confirm_password": OWN},
    )
    assert changed.status_code == 303 and changed.location.endswith("/staff/")
    assert _flag(app) is False
    assert newcomer.get("/staff/").status_code == 200
    assert newcomer.get("/staff/admin/audit").status_code == 200
    (row,) = _audit(engine, "staff.password_changed")
    assert row["target"] == f"staff:{EMAIL}"
    assert row["detail"] == {"replaced_one_set_for_them": True}
    everything = json.dumps([str(r) for r in all_rows(engine, "staff_audit")]) + caplog.text
    assert GIVEN not in everything and OWN not in everything
    # The next sign-in goes where it was asked to, like anyone's.
    newcomer.post("/staff/logout")
    again = newcomer.sign_in(EMAIL, OWN, next_path="/staff/admin/audit")
    assert again.location.endswith("/staff/admin/audit")


def test_an_ordinary_password_change_is_not_marked_as_a_replacement(engine, admin_browser):
    changed = admin_browser.post(
        "/staff/password",
        {"current_password": PASSWORD, "new_password": OWN, "confirm_password": OWN},
    )
    assert changed.status_code == 303
    (row,) = _audit(engine, "staff.password_changed")
    assert row["detail"] is None


def test_the_command_line_flags_the_account_it_makes(app, browser):
    made = app.test_cli_runner().invoke(
        args=["portal", "create-staff", EMAIL, "--role", "admin", "--password-stdin"],
        input=GIVEN + "\n",
    )
    assert made.exit_code == 0, made.output
    assert "asked to choose a new password" in made.output
    assert _flag(app) is True
    person = browser()
    assert person.sign_in(EMAIL, GIVEN).location.endswith("/staff/password")
    assert person.get("/staff/admin/staff").status_code == 303


def test_accounts_from_before_are_not_flagged(app, make_staff, browser):
    make_staff("old.hand@example.test", Role.ADMIN)
    assert _flag(app, "old.hand@example.test") is False
    person = browser()
    assert person.sign_in("old.hand@example.test").location.endswith("/staff/")
