"""Compliance forms. Every one posts (CSRF-checked): search values and export filters stay
out of URLs, browser history and access logs."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from wtforms import BooleanField, Field, StringField
from wtforms.validators import DataRequired, Length, ValidationError

from portal.compliance.services import LOOKUP_LABELS, LookupKind
from portal.inputs import CheckedForm
from portal.staff.catalogue_forms import RadioChoice
from portal.staff.forms import DateRangeChecks, parse_date, strip
from portal.subscriptions.validation import EndpointRefused, canonical_endpoint


def parse_uuid(text: str | None) -> uuid.UUID | None:
    try:
        return uuid.UUID((text or "").strip())
    except ValueError:
        return None


class LookupForm(CheckedForm):
    kind = RadioChoice(
        "Look up by",
        [(kind.value, LOOKUP_LABELS[kind]) for kind in LookupKind],
        message="Choose what you are looking up by",
    )
    value = StringField(
        "Value to look up",
        filters=[strip],
        validators=[
            DataRequired("Enter the value to look up"),
            Length(max=4096, message="The value is at most 4096 characters"),
        ],
    )

    def validate_value(self, field: Field) -> None:
        if self.kind.data == LookupKind.SUBSCRIBER_ID and parse_uuid(field.data) is None:
            raise ValidationError("A subscriber ID looks like 0190d1c0-5b6a-7c3e-9f00-1a2b3c4d5e6f")
        if self.kind.data == LookupKind.ENDPOINT:
            try:
                canonical_endpoint(field.data or "")
            except EndpointRefused:
                raise ValidationError(
                    "A push endpoint is an https:// URL, such as "
                    "https://fcm.googleapis.com/fcm/send/…"
                ) from None

    @property
    def lookup_kind(self) -> LookupKind:
        return LookupKind(self.kind.data or "")


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
