"""Compliance forms. The look-up's search is a GET (bookmarkable); the others post
(CSRF-checked), so a push endpoint and export filters stay out of URLs and browser history."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from wtforms import BooleanField, Field, StringField
from wtforms.validators import DataRequired, Length, ValidationError

from portal.inputs import CheckedForm
from portal.staff.catalogue_forms import RadioChoice
from portal.staff.forms import DateRangeChecks, parse_date, strip
from portal.subscriptions.validation import EndpointRefused, canonical_endpoint


def parse_uuid(text: str | None) -> uuid.UUID | None:
    try:
        return uuid.UUID((text or "").strip())
    except ValueError:
        return None


class SearchForm(CheckedForm):
    """The look-up's search, in the query string (``?q=…&page=N``) so a result can be
    bookmarked and reloaded: reading changes nothing, so no CSRF token."""

    class Meta:
        csrf = False

    q = StringField(
        "Reference, account ID, subscriber ID or erasure receipt ID",
        filters=[strip],
        validators=[Length(max=4096, message="The search is at most 4096 characters")],
    )
    page = StringField("Page", filters=[strip])


class EndpointLookupForm(CheckedForm):
    """A push endpoint is looked up by a form post: it never lands in a URL."""

    endpoint = StringField(
        "Push endpoint",
        filters=[strip],
        validators=[
            DataRequired("Enter the push endpoint"),
            Length(max=4096, message="The endpoint is at most 4096 characters"),
        ],
    )

    def validate_endpoint(self, field: Field) -> None:
        try:
            canonical_endpoint(field.data or "")
        except EndpointRefused:
            raise ValidationError(
                "A push endpoint is an https:// URL, such as https://fcm.googleapis.com/fcm/send/…"
            ) from None


class EraseForm(CheckedForm):
    confirm = BooleanField(
        "The person asked for their data to be erased",
        validators=[DataRequired("Tick the box to confirm the person asked for erasure")],
    )
    reference = StringField(
        "Request reference (optional)",
        filters=[strip],
        validators=[Length(max=100, message="The reference is at most 100 characters")],
    )


class ExportForm(DateRangeChecks, CheckedForm):
    date_from = StringField(
        "From", filters=[strip], validators=[DataRequired("Enter the first day")]
    )
    date_to = StringField("To", filters=[strip], validators=[DataRequired("Enter the last day")])
    data_format = RadioChoice(
        "Data format",
        [
            ("csv", "CSV (spreadsheets)"),
            ("ndjson", "NDJSON (one JSON object per line, for programs)"),
        ],
        message="Choose CSV or NDJSON",
    )
    topic = StringField("Topic", filters=[strip])  # rendered as a <select>
    subscriber = StringField("Subscriber ID (optional)", filters=[strip])

    def __init__(self, *args: Any, topics: list[tuple[str, str]] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.topic_choices = [("", "Every topic"), *(topics or [])]

    def validate_topic(self, field: Field) -> None:
        if field.data and field.data not in {value for value, _ in self.topic_choices}:
            raise ValidationError("Choose a topic from the list")

    def validate_subscriber(self, field: Field) -> None:
        if field.data and parse_uuid(field.data) is None:
            raise ValidationError("A subscriber ID looks like 0190d1c0-5b6a-7c3e-9f00-1a2b3c4d5e6f")

    def dates(self) -> tuple[dt.date, dt.date]:
        start, end = parse_date(self.date_from, "From"), parse_date(self.date_to, "To")
        assert start is not None
        assert end is not None
        return start, end
