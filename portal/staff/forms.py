"""Staff forms: Flask-WTF (CSRF on every state-changing one), validated on the server.

Field rules live in the services; these forms check presence and shape so the page can
name every problem at once, and the views turn service refusals into field errors.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from flask_wtf import FlaskForm
from wtforms import Field, PasswordField, StringField
from wtforms.validators import InputRequired, Length, ValidationError

from portal.clock import LAST_DAY
from portal.inputs import CheckedForm
from portal.staff.audit import action_labels
from portal.staff.models import Role
from portal.staff.passwords import MAX_LENGTH, password_problem
from portal.staff.services import email_problem, normalise_email

ROLE_CHOICES = [
    (Role.ADMIN.value, "Admin"),
    (Role.COMPLIANCE.value, "Compliance"),
    (Role.CAMPAIGNS.value, "Campaigns"),
]


def strip(value: Any) -> Any:
    """A form filter: surrounding white space never matters in these fields."""
    return value.strip() if isinstance(value, str) else value


def _valid_email(_form: FlaskForm, field: Field) -> None:
    problem = email_problem(normalise_email(field.data or ""))
    if problem:
        raise ValidationError(problem)


def _new_password(_form: FlaskForm, field: Field) -> None:
    problem = password_problem(field.data or "")
    if problem:
        raise ValidationError(problem)


class SignInForm(CheckedForm):
    email = StringField(
        "Email address",
        filters=[strip],
        validators=[InputRequired("Enter your email address"), _valid_email],
    )
    # Long passwords are fine; absurd ones are refused before they reach the hasher.
    password = PasswordField(
        "Password",
        validators=[
            InputRequired("Enter your password"),
            Length(max=MAX_LENGTH * 4, message="Email or password is wrong"),
        ],
    )


class RolesField(Field):
    """Role checkboxes: every submitted value, kept as a list. The template renders them
    inside a fieldset with a legend (plain fields, so no widget markup to undo)."""

    choices = ROLE_CHOICES

    def __init__(self, label: str = "Roles", **kwargs: Any) -> None:
        super().__init__(label, **kwargs)
        self.data: list[str] = []

    def process_data(self, value: Any) -> None:
        self.data = list(value or [])

    def process_formdata(self, valuelist: list[Any]) -> None:
        self.data = [str(v) for v in valuelist]

    def pre_validate(self, form: Any) -> None:
        known = {value for value, _ in ROLE_CHOICES}
        if not self.data:
            raise ValidationError("Choose at least one role")
        if any(value not in known for value in self.data):
            raise ValidationError("Choose roles from the list")


class CreateStaffForm(CheckedForm):
    email = StringField(
        "Email address",
        filters=[strip],
        validators=[InputRequired("Enter the email address"), _valid_email],
    )
    roles = RolesField()
    password = PasswordField(
        "Initial password",
        validators=[InputRequired("Enter an initial password"), _new_password],
    )


class RolesForm(CheckedForm):
    roles = RolesField()


class ConfirmForm(CheckedForm):
    """A button that changes something: only the CSRF token to check."""


class PasswordForm(CheckedForm):
    current_password = PasswordField(
        "Current password", validators=[InputRequired("Enter your current password")]
    )
    new_password = PasswordField(
        "New password", validators=[InputRequired("Enter a new password"), _new_password]
    )
    confirm_password = PasswordField(
        "Confirm new password", validators=[InputRequired("Enter the new password again")]
    )

    def validate_confirm_password(self, field: Field) -> None:
        if field.data != self.new_password.data:
            raise ValidationError("The new passwords do not match")


def parse_date(field: Field, label: str) -> dt.date | None:
    text = (field.data or "").strip()
    if not text:
        return None
    try:
        day = dt.date.fromisoformat(text)
    except ValueError:
        raise ValidationError(f"{label} must be a real date, like 2026-03-27") from None
    if day > LAST_DAY:
        raise ValidationError(f"{label} must be on or before {LAST_DAY.isoformat()}")
    return day


class DateRangeChecks:
    """The From/To checks shared by every form with a ``date_from`` and ``date_to``."""

    date_from: Field

    def validate_date_from(self, field: Field) -> None:
        parse_date(field, "From")

    def validate_date_to(self, field: Field) -> None:
        end = parse_date(field, "To")
        try:
            start = parse_date(self.date_from, "From")
        except ValidationError:
            return
        if start and end and end < start:
            raise ValidationError("To must be the same as or after From")


class AuditFilterForm(DateRangeChecks, CheckedForm):
    """Filters in the query string: reading changes nothing, so no CSRF token."""

    class Meta:
        csrf = False

    action = StringField("Action", filters=[strip])  # rendered as a <select>
    actor = StringField("Staff email", filters=[strip])
    date_from = StringField("From", filters=[strip])
    date_to = StringField("To", filters=[strip])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.action_choices = [("", "Any action"), *action_labels().items()]

    def validate_action(self, field: Field) -> None:
        if field.data and field.data not in action_labels():
            raise ValidationError("Choose an action from the list")

    def validate_actor(self, field: Field) -> None:
        if len(field.data or "") > 254:
            raise ValidationError("Staff email must be 254 characters or fewer")

    def dates(self) -> tuple[dt.date | None, dt.date | None]:
        return parse_date(self.date_from, "From"), parse_date(self.date_to, "To")


# Where each field's error links to: the first checkbox of a group, else the field.
# Where the error summary links for a field whose first input is not its id.
FIELD_ANCHORS = {"roles": "roles-admin"}
