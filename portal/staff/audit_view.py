"""What the audit trail page shows of an entry: who acted, what on, and the detail as
labelled fields, each target linked to its page when the viewer's roles open it.

:func:`describe` is the one place an audit row becomes words. Every value is returned as
plain text (the template escapes it), so a value someone typed — a topic label, a reference,
an unknown email — is shown, never interpreted as markup. Keys it does not know are still
shown, labelled from the key itself.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import url_for
from sqlalchemy.orm import Session

from portal.staff.access import may_use
from portal.staff.audit import CLI
from portal.staff.models import StaffAudit, StaffUser
from portal.staff.services import SignedIn


@dataclass(frozen=True)
class Shown:
    """A piece of text, with the address of its page when the viewer may open it."""

    text: str
    url: str | None = None


@dataclass(frozen=True)
class Field:
    label: str
    value: Shown


@dataclass(frozen=True)
class Entry:
    row: StaffAudit
    who: Shown
    target: Shown | None
    fields: list[Field]


# Labels for the detail keys the portal writes; anything else is labelled from its key.
_LABELS: dict[str, str] = {
    "roles": "Roles",
    "via": "Done through",
    "must_choose_own": "Must choose own password",
    "replaced_one_set_for_them": "Replaced the password set for them",
    "from": "From",
    "to": "To",
    "reason": "Reason",
    "minutes": "Locked for (minutes)",
    "sha256": "Text SHA-256",
    "previous": "Previous version",
    "lines_added": "Lines added",
    "lines_removed": "Lines removed",
    "category": "Category",
    "label": "Label",
    "description": "Description",
    "class": "Class",
    "default": "Default",
    "topic": "Topic",
    "title": "Title",
    "sendAt": "Sends at",
    "audience": "Audience",
    "byReason": "Audience by reason",
    "audienceCountedAt": "Audience counted at",
    "subscription": "Subscription",
    "subscriber": "Subscriber",
    "status": "Status",
    "changed": "Rows changed",
    "by": "Looked up by",
    "found": "Someone found",
    "format": "Format",
    "filters": "Filters",
    "rows": "Events",
    "event_seq": "Consent event",
    "subscriptions_ended": "Subscriptions ended",
    "reference": "Reference",
    "code": "Error code",
}
# The same key means something more precise under some actions.
_ACTION_LABELS: dict[tuple[str, str], str] = {
    ("staff.roles_changed", "from"): "Roles before",
    ("staff.roles_changed", "to"): "Roles after",
}
_WORDS: dict[str, dict[str, str]] = {
    "via": {"cli": "command line", "console": "staff console"},
    "reason": {
        "wrong_password": "wrong password",
        "locked": "account locked",
        "disabled": "account disabled",
        "unknown_email": "no account has this email",
    },
    "by": {
        "endpoint": "push endpoint",
        "external_user_id": "external user id",
        "subscriber_id": "subscriber id",
    },
    "default": {"opt_in": "opted in", "opt_out": "opted out"},
}
_SLUG = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$")
_JOB = re.compile(r"^[a-z0-9_-]{1,64}$")


def label_for(key: str, action: str = "") -> str:
    """A detail key as a label: a known one's words, else the key made readable
    (``lines_added`` and ``linesAdded`` both read "Lines added")."""
    known = _ACTION_LABELS.get((action, key)) or _LABELS.get(key)
    if known:
        return known
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key).replace("_", " ").replace("-", " ")
    words = " ".join(words.split()).lower()
    return words[:1].upper() + words[1:] if words else "(no name)"


def _text(value: Any, key: str = "") -> str:
    words = _WORDS.get(key, {})
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return words.get(value, value)
    if isinstance(value, int | float):
        return f"{value:,}" if isinstance(value, int) else str(value)
    if isinstance(value, Mapping):
        if set(value) == {"from", "to"}:  # an edit: old and new wording
            return f"“{_text(value['from'])}” → “{_text(value['to'])}”"
        if not value:
            return "none"
        return "; ".join(f"{label_for(str(k))}: {_text(v, str(k))}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_text(item, key) for item in value) if value else "none"
    return str(value)


class _Links:
    """Addresses of the pages targets have, for this viewer only."""

    def __init__(self, viewer: SignedIn, staff_ids: Mapping[str, uuid.UUID]) -> None:
        self.viewer = viewer
        self.staff_ids = staff_ids

    def _url(self, endpoint: str, **values: Any) -> str | None:
        return url_for(endpoint, **values) if may_use(self.viewer, endpoint) else None

    def staff(self, email: str) -> str | None:
        staff_id = self.staff_ids.get(email)
        return self._url("staff.staff_detail", staff_id=staff_id) if staff_id else None

    def staff_by_id(self, staff_id: uuid.UUID) -> str | None:
        return self._url("staff.staff_detail", staff_id=staff_id)

    def topic(self, slug: str) -> str | None:
        return self._url("staff.topic_edit", slug=slug) if _SLUG.fullmatch(slug) else None

    def policy(self, version: str) -> str | None:
        ok = _VERSION.fullmatch(version)
        return self._url("staff.policy_version", version=version) if ok else None

    def campaign(self, text: str) -> str | None:
        found = _uuid(text)
        return self._url("staff.campaign_detail", campaign_id=found) if found else None

    def subscriber(self, text: str) -> str | None:
        found = _uuid(text)
        return self._url("staff.compliance_subscriber", subscriber_id=found) if found else None

    def job(self, name: str) -> str | None:
        return self._url("staff.jobs_ops") if _JOB.fullmatch(name) else None


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


# target prefix -> (what it is called, how its page is found)
_TARGETS: dict[str, tuple[str, Callable[[_Links, str], str | None]]] = {
    "staff": ("Staff", _Links.staff),
    "topic": ("Topic", _Links.topic),
    "policy": ("Policy version", _Links.policy),
    "campaign": ("Campaign", _Links.campaign),
    "subscriber": ("Subscriber", _Links.subscriber),
    "job": ("Job", _Links.job),
}
_PLAIN_TARGETS = {"consent-log": "Consent log", "feedback:receiver": "Feedback receiver"}
# Detail keys whose value is itself something with a page.
_LINKED_KEYS: dict[str, Callable[[_Links, str], str | None]] = {
    "previous": _Links.policy,
    "topic": _Links.topic,
    "subscriber": _Links.subscriber,
}


def _target(target: str | None, links: _Links) -> Shown | None:
    if not target:
        return None
    if target in _PLAIN_TARGETS:
        return Shown(_PLAIN_TARGETS[target])
    kind, _, rest = target.partition(":")
    if kind in _TARGETS and rest:
        name, page = _TARGETS[kind]
        return Shown(f"{name}: {rest}", page(links, rest))
    return Shown(target)


def who(row: StaffAudit, links: _Links | None = None) -> Shown:
    """Who acted: a member of staff, the command line (and the operating-system user who
    ran it), an email no account has, or the system."""
    if row.actor_via == CLI:
        return Shown(f"command line (os user: {row.actor_os_user or 'unknown'})")
    if row.actor_id is not None:
        url = links.staff_by_id(row.actor_id) if links else None
        return Shown(row.actor_email or str(row.actor_id), url)
    if row.actor_email:
        return Shown(row.actor_email)
    if isinstance(row.detail, dict) and row.detail.get("via") == CLI:
        return Shown("command line")  # written before the operating-system user was kept
    return Shown("system")


def _fields(row: StaffAudit, links: _Links) -> list[Field]:
    detail = row.detail
    if detail is None:
        return []
    if not isinstance(detail, dict):
        return [Field("Detail", Shown(_text(detail)))]
    fields = []
    for key, value in detail.items():
        name = str(key)
        page = _LINKED_KEYS.get(name)
        url = page(links, value) if page and isinstance(value, str) else None
        fields.append(Field(label_for(name, row.action), Shown(_text(value, name), url)))
    return fields


def describe(session: Session, rows: Sequence[StaffAudit], viewer: SignedIn) -> list[Entry]:
    """Each row as the audit page shows it to ``viewer``."""
    links = _Links(viewer, _staff_ids(session, _staff_emails(rows)))
    return [
        Entry(row, who(row, links), _target(row.target, links), _fields(row, links)) for row in rows
    ]


def _staff_emails(rows: Iterable[StaffAudit]) -> set[str]:
    return {
        row.target.partition(":")[2]
        for row in rows
        if row.target and row.target.startswith("staff:")
    }


def _staff_ids(session: Session, emails: set[str]) -> dict[str, uuid.UUID]:
    if not emails:
        return {}
    found = session.execute(
        sa.select(StaffUser.email, StaffUser.id).where(StaffUser.email.in_(sorted(emails)))
    ).all()
    return {row.email: row.id for row in found}
