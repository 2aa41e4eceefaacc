"""The staff audit trail: one append-only row per thing staff did (or tried to do).

Other packages call :func:`record` in the same transaction as the change it describes,
so the change and its audit row commit or roll back together.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from flask import has_app_context
from sqlalchemy.orm import Session

from portal.seams import current_portal
from portal.staff.models import StaffAudit


class Action:
    """Audit action names. Other packages add theirs (``campaign.launched`` …) as plain
    strings; these are the ones the staff console writes."""

    SIGNED_IN = "staff.signed_in"
    SIGN_IN_FAILED = "staff.sign_in_failed"
    SIGNED_OUT = "staff.signed_out"
    LOCKED_OUT = "staff.locked_out"
    CREATED = "staff.created"
    ROLES_CHANGED = "staff.roles_changed"
    DISABLED = "staff.disabled"
    ENABLED = "staff.enabled"
    PASSWORD_CHANGED = "staff.password_changed"  # noqa: S105 - an action name
    PASSWORD_CHANGE_FAILED = "staff.password_change_failed"  # noqa: S105 - an action name

    ALL = (
        SIGNED_IN,
        SIGN_IN_FAILED,
        SIGNED_OUT,
        LOCKED_OUT,
        CREATED,
        ROLES_CHANGED,
        DISABLED,
        ENABLED,
        PASSWORD_CHANGED,
        PASSWORD_CHANGE_FAILED,
    )


_LABELS: dict[str, str] = {
    Action.SIGNED_IN: "Signed in",
    Action.SIGN_IN_FAILED: "Sign-in failed",
    Action.SIGNED_OUT: "Signed out",
    Action.LOCKED_OUT: "Locked out",
    Action.CREATED: "Staff user created",
    Action.ROLES_CHANGED: "Roles changed",
    Action.DISABLED: "Staff user disabled",
    Action.ENABLED: "Staff user enabled",
    Action.PASSWORD_CHANGED: "Password changed",
    Action.PASSWORD_CHANGE_FAILED: "Password change refused",
}


def register_action(name: str, label: str) -> None:
    """Other packages name their actions here so the audit page can filter by them."""
    _LABELS.setdefault(name, label)


def action_labels() -> dict[str, str]:
    return dict(_LABELS)


class Actor(Protocol):
    """Whoever acted: a :class:`~portal.staff.models.StaffUser` or the signed-in staff."""

    @property
    def id(self) -> uuid.UUID: ...

    @property
    def email(self) -> str: ...


@dataclass(frozen=True)
class Anonymous:
    """No staff account: the command line, a job, or a sign-in with an unknown email."""

    email: str | None = None


CLI = "cli"
_OS_USER_MAX = 64


@dataclass(frozen=True)
class CommandLine:
    """A ``portal …`` command: recorded as actor ``cli`` with the operating-system user
    who ran it (no staff account signs in on the command line)."""

    os_user: str


def command_line_actor() -> CommandLine:
    """The actor every ``portal …`` command records, with the operating-system user from
    the seam (:attr:`portal.seams.Portal.os_user`, which tests replace)."""
    name = current_portal().os_user()
    name = "".join(ch for ch in name if ch.isprintable()).strip()[:_OS_USER_MAX]
    return CommandLine(name or "unknown")


# Words in a key that would put a secret into an append-only table nobody can clean up.
_SECRET_WORDS = frozenset(
    {"password", "passwd", "passphrase", "secret", "token", "cookie", "credential", "private"}
)


class SecretInAudit(ValueError):
    """``detail`` carried something that looks like a secret."""


# Whoever an audit row names: staff, the command line, an unknown email, or the system.
AnyActor = Actor | Anonymous | CommandLine | None


def _check_detail(detail: Any, path: str = "detail") -> None:
    if isinstance(detail, dict):
        for name, value in detail.items():
            snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(name))  # privateKey too
            words = set(re.split(r"[^a-z0-9]+", snake.lower()))
            if words & _SECRET_WORDS or any(w.rstrip("s") in _SECRET_WORDS for w in words):
                raise SecretInAudit(f"{path}.{name} looks like a secret: audit rows are forever")
            _check_detail(value, f"{path}.{name}")
    elif isinstance(detail, list | tuple):
        for index, value in enumerate(detail):
            _check_detail(value, f"{path}[{index}]")


def _now() -> dt.datetime:
    if has_app_context():
        return current_portal().clock.now()
    return dt.datetime.now(dt.UTC)


def record(
    session: Session,
    actor: AnyActor,
    action: str,
    target: str | None = None,
    detail: dict[str, Any] | None = None,
    *,
    at: dt.datetime | None = None,
) -> StaffAudit:
    """Add one audit row to ``session`` (the caller commits).

    ``actor`` is a member of staff, :func:`command_line_actor` for a ``portal …``
    command, or None for the system.
    ``target`` names what was acted on (``staff:ann@example.com``, ``campaign:<id>``).
    ``detail`` is a small JSON object; keys that look like secrets are refused.
    """
    _check_detail(detail)
    via = os_user = None
    if isinstance(actor, CommandLine):
        actor_id, actor_email, via, os_user = None, None, CLI, actor.os_user[:_OS_USER_MAX]
    elif actor is None or isinstance(actor, Anonymous):
        actor_id, actor_email = None, actor.email if actor else None
    else:
        actor_id, actor_email = actor.id, actor.email
    row = StaffAudit(
        at=at or _now(),
        actor_id=actor_id,
        actor_email=actor_email[:254] if actor_email else None,
        action=action[:64],
        target=target[:255] if target else None,
        detail=detail or None,
        actor_via=via,
        actor_os_user=os_user,
    )
    session.add(row)
    return row


def staff_target(email: str) -> str:
    return f"staff:{email}"


@dataclass(frozen=True)
class AuditFilter:
    action: str | None = None
    actor_email: str | None = None
    start: dt.date | None = None  # UTC days, inclusive
    end: dt.date | None = None


@dataclass(frozen=True)
class AuditPage:
    rows: list[StaffAudit]
    newer: int | None  # pass as ``after`` for the next newer page, None on the newest
    older: int | None  # pass as ``before`` for the next older page, None on the oldest


def _conditions(where: AuditFilter) -> list[sa.ColumnElement[bool]]:
    conditions: list[sa.ColumnElement[bool]] = []
    if where.action:
        conditions.append(StaffAudit.action == where.action)
    if where.actor_email:
        conditions.append(StaffAudit.actor_email == where.actor_email.strip().lower())
    if where.start:
        conditions.append(StaffAudit.at >= _midnight(where.start))
    if where.end:
        conditions.append(StaffAudit.at < _midnight(where.end + dt.timedelta(days=1)))
    return conditions


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)


def search(
    session: Session,
    where: AuditFilter,
    *,
    before: int | None = None,
    after: int | None = None,
    limit: int = 50,
) -> AuditPage:
    """One page of the trail, newest first, by keyset on the id (never OFFSET): ``before``
    pages towards older rows, ``after`` towards newer ones."""
    conditions = _conditions(where)
    query = sa.select(StaffAudit).where(*conditions)
    if after is not None:
        rows = list(
            session.scalars(query.where(StaffAudit.id > after).order_by(StaffAudit.id).limit(limit))
        )
        rows.reverse()
    else:
        if before is not None:
            query = query.where(StaffAudit.id < before)
        rows = list(session.scalars(query.order_by(StaffAudit.id.desc()).limit(limit)))
    if not rows:
        return AuditPage([], None, None)

    def exists(condition: sa.ColumnElement[bool]) -> bool:
        probe = sa.select(StaffAudit.id).where(*conditions, condition).limit(1)
        return session.execute(probe).first() is not None

    newer = rows[0].id if exists(StaffAudit.id > rows[0].id) else None
    older = rows[-1].id if exists(StaffAudit.id < rows[-1].id) else None
    return AuditPage(rows, newer, older)
