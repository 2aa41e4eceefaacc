"""Text from outside: what a form field, a route parameter or a query string may carry.

One rule, :func:`text_problem`: no control character (C0, DEL, C1), except the tab and
line breaks of a multi-line field (a notice text, a message), and no bidirectional
override (U+202D, U+202E: the text would show in another order than it is kept).
PostgreSQL cannot store NUL in text at all, and nothing the portal keeps or looks up
has a use for the others, so such input is refused with the field named — never
stripped and then stored.

Three doors use it:

- :class:`CheckedForm`, the base of the staff forms, runs it first on every field, its
  choices and checkboxes included (passwords aside: they are hashed, never stored or
  looked up);
- :func:`check_request`, before every view: a route parameter that breaks the rule names
  nothing (404), a query string that does is a bad request (400) — except on views that
  read their query string through a form (:func:`query_form`), which name the field, and
  on the JSON API, which answers 400 ``invalid_parameter`` naming the parameter;
- services that store text typed elsewhere (the command line, a policy file) call it
  themselves: the catalogue's topics and notices, staff e-mail addresses, campaigns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from flask import Flask, abort, current_app, request
from flask_wtf import FlaskForm
from wtforms import Field, FileField, PasswordField, TextAreaField
from wtforms.csrf.core import CSRFTokenField
from wtforms.validators import StopValidation

from portal.errors import ApiError

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# A multi-line field keeps its tabs and line breaks (browsers send CRLF).
_CONTROL_MULTILINE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_NAMES = {"\x00": "a NUL", "\t": "a tab", "\n": "a line break", "\r": "a line break"}
# The two bidirectional overrides: what follows them shows in another order than it is
# stored ("Offers \u202eLIAM-E" reads "Offers E-MAIL"), on the page and in a notification.
# Marks, embeddings and isolates, which right-to-left text uses, are left alone.
_OVERRIDE = re.compile("[\u202d\u202e]")
_OVERRIDE_NAMES = {"\u202d": "a left-to-right override", "\u202e": "a right-to-left override"}

F = TypeVar("F", bound=Callable[..., Any])


def text_problem(text: str, *, multiline: bool = False) -> str | None:
    """Why ``text`` cannot be the value of a field, to follow the field's name; or None.

    The message says what and where (the character is invisible on the page).
    """
    found = (_CONTROL_MULTILINE if multiline else _CONTROL).search(text)
    if found is not None:
        char = found.group()
        what = _NAMES.get(char, f"U+{ord(char):04X}")
        where = found.start() + 1
        return f"must not contain control characters (there is {what} at character {where})"
    found = _OVERRIDE.search(text)
    if found is not None:
        what = f"{_OVERRIDE_NAMES[found.group()]}, U+{ord(found.group()):04X},"
        return (
            f"must not contain {what} at character {found.start() + 1}: it shows the "
            "text after it in another order than it is kept"
        )
    if not _encodable(text):
        # Form and URL decoding replace what is not UTF-8; this guards other callers.
        return "must be text (it has an unpaired surrogate character)"
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def field_name(field: Field) -> str:
    """How an error message names a field: its label, without an "(optional)"."""
    return re.sub(r"\s*\(optional\)$", "", str(field.label.text))


class PlainText:
    """The WTForms validator of :func:`text_problem`, on what was submitted (before any
    filter strips it): refusing is the point, so nothing is trimmed away first."""

    def __init__(self, *, multiline: bool = False) -> None:
        self.multiline = multiline

    def __call__(self, form: Any, field: Field) -> None:
        for value in field.raw_data or ():
            if not isinstance(value, str):
                continue
            problem = text_problem(value, multiline=self.multiline)
            if problem:
                raise StopValidation(f"{field_name(field)} {problem}")


class CheckedForm(FlaskForm):
    """A form whose every field (text, choices, checkboxes) is checked by
    :class:`PlainText` before its own validators run, so the first error a field shows is
    the one that matters. (The CSRF token is Flask-WTF's to check, passwords are never
    stored, and files are checked as files.)"""

    class Meta:
        def bind_field(self, form: Any, unbound_field: Any, options: dict[str, Any]) -> Field:
            field = unbound_field.bind(form=form, **options)
            # Every field that takes text from the request: choices and checkboxes too,
            # whose value is never stored, but a crafted one is still bad input.
            if not isinstance(field, PasswordField | CSRFTokenField | FileField):
                check = PlainText(multiline=isinstance(field, TextAreaField))
                field.validators = [check, *field.validators]
            return field

    def check_text(self) -> bool:
        """Only the text rule, on every field: for a form whose other checks live in a
        service (the campaign form). Each refused field gets the error."""
        ok = True
        for field in self:
            for validator in field.validators:
                if isinstance(validator, PlainText):
                    try:
                        validator(self, field)
                    except StopValidation as problem:
                        field.errors = [str(problem)]
                        ok = False
        return ok


def query_form(view: F) -> F:
    """Mark a view that reads its query string through a :class:`CheckedForm`: the form
    names a bad field on the page, so :func:`check_request` leaves the query to it."""
    view.query_form = True  # type: ignore[attr-defined]
    return view


def check_request() -> None:
    """Refuse route parameters and query strings that break :func:`text_problem`. The
    JSON API names the parameter (400 ``invalid_parameter``, as for any bad parameter
    there); a page answers 404 for a route parameter and 400 for a query string."""
    api = request.path.startswith("/api/")
    for name, value in (request.view_args or {}).items():
        if isinstance(value, str) and text_problem(value):
            if api:
                _refuse_parameter(name)
            abort(404)  # no topic, version or job has such a name
    view = current_app.view_functions.get(request.endpoint or "")
    if getattr(view, "query_form", False):
        return
    for name, values in request.args.lists():
        if text_problem(name) or any(text_problem(v) for v in values):
            if api:
                _refuse_parameter(None if text_problem(name) else name)
            abort(400)


def _refuse_parameter(name: str | None) -> NoReturn:
    """Named when it has a name that can be shown (not empty, not itself the problem)."""
    raise ApiError(
        "invalid_parameter",
        f"{name or 'a parameter'} must not hold a control character or a direction override",
        name or None,
    )


def error_list(
    form: FlaskForm,
    extra: Sequence[tuple[str, str]] = (),
    *,
    order: Sequence[str] | None = None,
    anchors: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """(anchor, message) pairs for a page's error summary: each field's first error, in
    the order the fields appear on the page (``order``, by field name, when it is not
    the form's own), then ``extra``. The anchor is the element the summary links to: a
    field's ``anchor`` when it has one, else ``anchors[id]``, else its id."""
    fields = list(form) if order is None else [getattr(form, n) for n in order if hasattr(form, n)]
    errors = [
        (getattr(field, "anchor", None) or (anchors or {}).get(field.id, field.id), field.errors[0])
        for field in fields
        if field.errors and field.name != "csrf_token"
    ]
    return errors + list(extra)


def init_app(app: Flask) -> None:
    app.before_request(check_request)
