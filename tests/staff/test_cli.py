"""``flask --app app portal create-staff``."""

from __future__ import annotations

import json

import sqlalchemy as sa

from portal.db import db
from portal.staff.models import Role, StaffUser
from tests.helpers import all_rows, count_rows

PASSWORD = "a long and lovely passphrase"


def _invoke(app, *args, input=None):
    return app.test_cli_runner().invoke(args=["portal", "create-staff", *args], input=input)


def _user(app, email):
    with app.app_context():
        user = db.session.scalars(sa.select(StaffUser).where(StaffUser.email == email)).one()
        _ = user.roles
        return user


def test_create_staff_with_the_password_on_stdin(app, engine, browser):
    result = _invoke(
        app,
        "Ops@Example.test",
        "--role",
        "admin",
        "--role",
        "compliance",
        "--password-stdin",
        input=PASSWORD + "\n",
    )
    assert result.exit_code == 0, result.output
    assert "created staff user ops@example.test with roles admin, compliance" in result.output
    assert PASSWORD not in result.output
    user = _user(app, "ops@example.test")
    assert user.roles == {Role.ADMIN, Role.COMPLIANCE}
    (row,) = all_rows(engine, "staff_audit")
    detail = json.loads(row["detail"]) if isinstance(row["detail"], str) else row["detail"]
    assert (row["action"], row["actor_id"], detail["via"]) == ("staff.created", None, "cli")
    assert browser().sign_in("ops@example.test", PASSWORD).status_code == 303


def test_only_the_first_line_of_stdin_is_the_password(app, browser):
    result = _invoke(
        app,
        "ops@example.test",
        "--role",
        "campaigns",
        "--password-stdin",
        input=f"{PASSWORD}\nmore\n",
    )
    assert result.exit_code == 0, result.output
    assert browser().sign_in("ops@example.test", PASSWORD).status_code == 303


def test_create_staff_with_a_prompt_asks_twice(app, browser):
    result = _invoke(
        app, "ops@example.test", "--role", "campaigns", input=f"{PASSWORD}\n{PASSWORD}\n"
    )
    assert result.exit_code == 0, result.output
    assert "Password:" in result.output and "Repeat the password:" in result.output
    assert PASSWORD not in result.output  # the prompt hides what is typed
    assert browser().sign_in("ops@example.test", PASSWORD).status_code == 303


def test_the_prompt_refuses_a_short_password_and_asks_again(app):
    result = _invoke(
        app, "ops@example.test", "--role", "admin", input=f"short\nshort\n{PASSWORD}\n{PASSWORD}\n"
    )
    assert result.exit_code == 0, result.output
    assert "Password must be 12 characters or more" in result.output


def test_a_short_password_on_stdin_fails(app, engine):
    result = _invoke(
        app, "ops@example.test", "--role", "admin", "--password-stdin", input="short\n"
    )
    assert result.exit_code == 1
    assert "Password must be 12 characters or more" in result.output
    assert count_rows(engine, "staff_user") == 0


def test_an_existing_email_fails(app, engine):
    args = ("ops@example.test", "--role", "admin", "--password-stdin")
    assert _invoke(app, *args, input=PASSWORD + "\n").exit_code == 0
    again = _invoke(
        app, "OPS@example.test", "--role", "admin", "--password-stdin", input=PASSWORD + "\n"
    )
    assert again.exit_code == 1
    assert "already exists" in again.output
    assert count_rows(engine, "staff_user") == 1


def test_role_is_required_and_checked(app, engine):
    missing = _invoke(app, "ops@example.test", "--password-stdin", input=PASSWORD + "\n")
    assert missing.exit_code == 2
    assert "--role" in missing.output
    wrong = _invoke(
        app, "ops@example.test", "--role", "root", "--password-stdin", input=PASSWORD + "\n"
    )
    assert wrong.exit_code == 2
    assert "admin" in wrong.output and "compliance" in wrong.output
    assert count_rows(engine, "staff_user") == 0


def test_a_bad_email_fails(app):
    result = _invoke(
        app, "not-an-email", "--role", "admin", "--password-stdin", input=PASSWORD + "\n"
    )
    assert result.exit_code == 1
    assert "correct format" in result.output


def test_the_command_is_listed(app):
    result = app.test_cli_runner().invoke(args=["portal", "--help"])
    assert "create-staff" in result.output
