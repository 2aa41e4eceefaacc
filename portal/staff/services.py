"""Staff rules: accounts and roles, sign-in with lockout and throttling, sessions.

Plain functions over a session, like the other packages' services: they take the time
(``now``) and the policy, validate their own inputs, write the audit trail, and commit nothing —
the caller owns the transaction.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import hmac
import logging
import re
import secrets
import unicodedata
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from portal.config import StaffAuthSettings
from portal.db import UTCDateTime, is_postgres
from portal.inputs import text_problem
from portal.staff import audit
from portal.staff.audit import Action, Anonymous, staff_target
from portal.staff.lockout import LockoutPolicy, LockState, after_failure, after_success
from portal.staff.models import (
    Role,
    StaffLoginThrottle,
    StaffSession,
    StaffUser,
    ThrottleKind,
)
from portal.staff.passwords import Passwords, password_problem

log = logging.getLogger("portal.staff")

EMAIL_MAX_LENGTH = 254
# Deliberately loose: one @, something on each side, a dot in the domain, no spaces.
# Whether the address works is the mail system's business, not a regex's.
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_ADDRESS_WINDOW = dt.timedelta(minutes=1)
_THROTTLE = cast(sa.Table, StaffLoginThrottle.__table__)
# An unknown email's failure streak is forgotten after this long without a lock.
_EMAIL_STREAK_RETENTION = dt.timedelta(days=30)


class StaffError(Exception):
    """A staff action refused by a rule; ``field`` names the form field at fault."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFound(StaffError):
    pass


class RecordedRefusal(StaffError):
    """A refusal that is itself recorded — a failed password check counts toward the
    lockout and is audited — so the caller commits rather than rolls back. ``minutes``
    is the wait when the account is locked."""

    def __init__(self, message: str, field: str | None = None, *, minutes: int = 0) -> None:
        super().__init__(message, field)
        self.minutes = minutes


def wait_message(minutes: int) -> str:
    unit = "minute" if minutes == 1 else "minutes"
    return f"Too many attempts: try again in {minutes} {unit}"


@dataclass(frozen=True)
class StaffPolicy:
    """The sign-in rules, from :class:`portal.config.StaffAuthSettings`."""

    lockout: LockoutPolicy
    attempts_per_minute: int
    session_idle: dt.timedelta
    session_max: dt.timedelta

    @classmethod
    def from_settings(cls, settings: StaffAuthSettings) -> StaffPolicy:
        return cls(
            lockout=LockoutPolicy(
                attempts=settings.lockout_attempts,
                duration=dt.timedelta(minutes=settings.lockout_minutes),
            ),
            attempts_per_minute=settings.attempts_per_minute,
            session_idle=dt.timedelta(minutes=settings.session_idle_minutes),
            session_max=dt.timedelta(hours=settings.session_max_hours),
        )


@dataclass(frozen=True)
class SignedIn:
    """The member of staff behind the current request."""

    id: uuid.UUID
    email: str
    roles: frozenset[Role]
    session_id: bytes
    # Signed in with a password someone else chose: only the password page opens.
    must_replace_password: bool = False

    def has_any(self, roles: Iterable[Role]) -> bool:
        """Roles are checked strictly: admin grants the admin pages, not the others."""
        return bool(self.roles & frozenset(roles))


# -- emails and roles ---------------------------------------------------------------------


def normalise_email(text: str) -> str:
    return text.strip().lower()


def _invisible(char: str) -> bool:
    """A format, private-use or unassigned character: nothing an address needs."""
    return unicodedata.category(char) in {"Cf", "Co", "Cn"}


def email_problem(email: str) -> str | None:
    if not email:
        return "Enter an email address"
    if len(email) > EMAIL_MAX_LENGTH:
        return f"Email address must be {EMAIL_MAX_LENGTH} characters or fewer"
    problem = text_problem(email)
    if problem:
        return f"Email address {problem}"
    invisible = next((i for i, c in enumerate(email) if _invisible(c)), None)
    if invisible is not None:
        # "admin\u200b@…" would be a second account that reads as "admin@…" everywhere.
        return (
            "Email address must not contain invisible characters (there is "
            f"U+{ord(email[invisible]):04X} at character {invisible + 1})"
        )
    if not _EMAIL.match(email):
        return "Enter an email address in the correct format, like name@example.com"
    return None


def parse_roles(values: Iterable[str]) -> frozenset[Role]:
    try:
        return frozenset(Role(v) for v in values)
    except ValueError:
        raise StaffError("Choose roles from the list", "roles") from None


# -- accounts -----------------------------------------------------------------------------


def find_by_email(session: Session, email: str) -> StaffUser | None:
    return session.scalars(
        sa.select(StaffUser).where(StaffUser.email == normalise_email(email))
    ).one_or_none()


def get_staff(session: Session, staff_id: uuid.UUID) -> StaffUser:
    user = session.get(StaffUser, staff_id)
    if user is None:
        raise NotFound("No staff user has this id")
    return user


def list_staff(session: Session) -> list[StaffUser]:
    return list(session.scalars(sa.select(StaffUser).order_by(StaffUser.email)))


def create_staff(
    session: Session,
    *,
    email: str,
    password: str,
    roles: Iterable[Role],
    actor: SignedIn | audit.CommandLine | None,
    passwords: Passwords,
    now: dt.datetime,
    must_replace_password: bool,
    via: str = "console",
) -> StaffUser:
    """Add a member of staff. ``actor`` is :func:`audit.command_line_actor` on the command
    line. ``must_replace_password``: the password was chosen by someone other than the
    person (an admin, the command line), who must replace it at first sign-in."""
    email = normalise_email(email)
    problem = email_problem(email)
    if problem:
        raise StaffError(problem, "email")
    role_set = frozenset(roles)
    if not role_set:
        raise StaffError("Choose at least one role", "roles")
    problem = password_problem(password)
    if problem:
        raise StaffError(problem, "password")
    if find_by_email(session, email) is not None:
        raise StaffError("A staff user with this email address already exists", "email")
    user = StaffUser(
        email=email,
        password_hash=passwords.hash(password),
        created_at=now,
        must_replace_password=must_replace_password,
    )
    user.set_roles(role_set)
    session.add(user)
    session.flush()
    audit.record(
        session,
        actor,
        Action.CREATED,
        staff_target(email),
        {"roles": sorted(role_set), "via": via, "must_choose_own": must_replace_password},
        at=now,
    )
    return user


def set_roles(
    session: Session,
    staff_id: uuid.UUID,
    roles: Iterable[Role],
    *,
    actor: SignedIn,
    now: dt.datetime,
) -> bool:
    """Replace a staff user's roles; False when nothing changed."""
    user = get_staff(session, staff_id)
    new = frozenset(roles)
    if not new:
        raise StaffError("Choose at least one role: to remove all access, disable the account")
    if user.id == actor.id and Role.ADMIN not in new:
        # Otherwise the last admin could lock everyone out of staff administration.
        raise StaffError("You cannot remove your own admin role", "roles")
    old = user.roles
    if new == old:
        return False
    user.set_roles(new)
    audit.record(
        session,
        actor,
        Action.ROLES_CHANGED,
        staff_target(user.email),
        {"from": sorted(old), "to": sorted(new)},
        at=now,
    )
    return True


def disable_staff(
    session: Session, staff_id: uuid.UUID, *, actor: SignedIn, now: dt.datetime
) -> bool:
    """Disable an account and end its sessions at once; False if it was disabled."""
    user = get_staff(session, staff_id)
    if user.id == actor.id:
        raise StaffError("You cannot disable your own account")
    if user.disabled_at is not None:
        return False
    user.disabled_at = now
    session.execute(sa.delete(StaffSession).where(StaffSession.staff_user_id == user.id))
    audit.record(session, actor, Action.DISABLED, staff_target(user.email), at=now)
    return True


def enable_staff(
    session: Session, staff_id: uuid.UUID, *, actor: SignedIn, now: dt.datetime
) -> bool:
    user = get_staff(session, staff_id)
    if user.disabled_at is None:
        return False
    user.disabled_at = None
    audit.record(session, actor, Action.ENABLED, staff_target(user.email), at=now)
    return True


def change_password(
    session: Session,
    *,
    actor: SignedIn,
    current: str,
    new: str,
    passwords: Passwords,
    policy: StaffPolicy,
    now: dt.datetime,
) -> str:
    """Change one's own password; every session of the account ends, this one too, and
    the token of a new one is returned (for this browser's cookie, until the old
    session's absolute end): a copy of the old cookie, taken by whoever made the person
    change their password, opens nothing any more.

    The current password is checked under the sign-in lockout: a wrong one is a failed
    attempt like a wrong one at sign-in (one count for both), and while the account is
    locked no password is checked here either. Otherwise a stolen session could try
    passwords without limit."""
    user = get_staff(session, actor.id)
    session.refresh(user, with_for_update=True)  # serialise attempts on one account
    state = LockState(user.failed_logins, user.locked_until)
    target = staff_target(user.email)
    if state.is_locked(now):
        audit.record(
            session, actor, Action.PASSWORD_CHANGE_FAILED, target, {"reason": "locked"}, at=now
        )
        minutes = state.minutes_left(now)
        raise RecordedRefusal(wait_message(minutes), "current_password", minutes=minutes)
    if not passwords.verify(user.password_hash, current):
        counted = _count_failure(
            session, user, state, now, policy, actor, Action.PASSWORD_CHANGE_FAILED
        )
        if counted.is_locked(now):
            minutes = counted.minutes_left(now)
            raise RecordedRefusal(wait_message(minutes), "current_password", minutes=minutes)
        raise RecordedRefusal("Your current password is wrong", "current_password")
    problem = password_problem(new)
    if problem:
        raise StaffError(problem, "new_password")
    if passwords.verify(user.password_hash, new):
        raise StaffError(
            "Your new password must be different from your current one", "new_password"
        )
    cleared = after_success(state)
    user.failed_logins, user.locked_until = cleared.failures, cleared.locked_until
    user.password_hash = passwords.hash(new)
    required = user.must_replace_password
    user.must_replace_password = False
    ending = session.get(StaffSession, actor.session_id)
    expires_at = ending.expires_at if ending is not None else now + policy.session_max
    session.execute(sa.delete(StaffSession).where(StaffSession.staff_user_id == user.id))
    audit.record(
        session,
        actor,
        Action.PASSWORD_CHANGED,
        staff_target(user.email),
        {"replaced_one_set_for_them": True} if required else None,
        at=now,
    )
    return _start_session(session, user, now=now, expires_at=expires_at)


def _start_session(
    session: Session, user: StaffUser, *, now: dt.datetime, expires_at: dt.datetime
) -> str:
    """A new session of ``user``; its token (only its hash is stored)."""
    token = secrets.token_urlsafe(32)
    session.add(
        StaffSession(
            id=session_id(token),
            staff_user_id=user.id,
            created_at=now,
            last_seen_at=now,
            expires_at=expires_at,
        )
    )
    return token


# -- sign-in ------------------------------------------------------------------------------


class Outcome(enum.StrEnum):
    SIGNED_IN = "signed_in"
    WRONG = "wrong"  # email or password is wrong, or the account is disabled (never says which)
    LOCKED = "locked"  # the account (or the unknown email) is locked out
    THROTTLED = "throttled"  # too many attempts from this client address


@dataclass(frozen=True)
class SignInResult:
    outcome: Outcome
    token: str | None = None  # the new session's cookie value
    minutes: int = 0  # for LOCKED and THROTTLED: how long to wait
    user: StaffUser | None = None


def throttle_key(pepper: bytes, kind: ThrottleKind, value: str) -> bytes:
    """Keyed, so the table holds neither addresses nor typed emails in a guessable form."""
    return hmac.new(pepper, f"{kind.value}:{value}".encode(), hashlib.sha256).digest()


def session_id(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _insert(session: Session, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
    return (postgresql.insert if is_postgres(session) else sqlite.insert)(table)


def _count_address_attempt(
    session: Session, key: bytes, now: dt.datetime
) -> tuple[int, dt.datetime]:
    """Count one attempt in this address's one-minute window, atomically on both
    databases; returns the attempts so far in the window and when it started."""
    t = _THROTTLE
    when = sa.literal(now, UTCDateTime())
    fresh = t.c.window_started_at <= sa.literal(now - _ADDRESS_WINDOW, UTCDateTime())
    statement = (
        _insert(session, t)
        .values(key=key, kind=ThrottleKind.ADDRESS.value, attempts=1, window_started_at=now)
        .on_conflict_do_update(
            index_elements=[t.c.key],
            set_={
                "attempts": sa.case((fresh, 1), else_=t.c.attempts + 1),
                "window_started_at": sa.case((fresh, when), else_=t.c.window_started_at),
            },
        )
        .returning(t.c.attempts, t.c.window_started_at)
    )
    row = session.execute(statement).one()
    return row.attempts, row.window_started_at


def _email_lock_row(session: Session, key: bytes, now: dt.datetime) -> StaffLoginThrottle:
    t = _THROTTLE
    session.execute(
        _insert(session, t)
        .values(key=key, kind=ThrottleKind.EMAIL.value, attempts=0, window_started_at=now)
        .on_conflict_do_nothing(index_elements=[t.c.key])
    )
    return session.scalars(
        sa.select(StaffLoginThrottle)
        .where(StaffLoginThrottle.key == key)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()


def sign_in(
    session: Session,
    *,
    email: str,
    password: str,
    client_address: str | None,
    old_token: str | None,
    passwords: Passwords,
    policy: StaffPolicy,
    now: dt.datetime,
    pepper: bytes,
) -> SignInResult:
    """Check the credentials under the lockout and throttle rules; on success, start a
    new session (the browser's previous one, if any, is deleted)."""
    email = normalise_email(email)

    attempts, started = _count_address_attempt(
        session, throttle_key(pepper, ThrottleKind.ADDRESS, client_address or "unknown"), now
    )
    if attempts > policy.attempts_per_minute:
        log.warning("staff sign-in throttled: %d attempts from one address", attempts)
        wait = LockState(locked_until=started + _ADDRESS_WINDOW).minutes_left(now)
        return SignInResult(Outcome.THROTTLED, minutes=wait)

    user = find_by_email(session, email)
    # Always one hash verification, account or not, so timing does not tell them apart.
    correct = passwords.verify(user.password_hash if user else None, password)

    if user is None:
        return _unknown_email(session, email, pepper, policy, now)

    session.refresh(user, with_for_update=True)  # serialise attempts on one account
    state = LockState(user.failed_logins, user.locked_until)
    target = staff_target(user.email)
    if state.is_locked(now):
        audit.record(session, user, Action.SIGN_IN_FAILED, target, {"reason": "locked"}, at=now)
        return SignInResult(Outcome.LOCKED, minutes=state.minutes_left(now), user=user)
    if not correct or user.disabled_at is not None:
        # A disabled account's right password is a failed attempt like a wrong one: the
        # answer (and the count toward the lockout) never tells the two apart. The audit
        # trail, which only staff read, keeps which it was.
        reason = "wrong_password" if not correct else "disabled"
        new = _count_failure(
            session, user, state, now, policy, user, Action.SIGN_IN_FAILED, reason=reason
        )
        if new.is_locked(now):
            return SignInResult(Outcome.LOCKED, minutes=new.minutes_left(now), user=user)
        return SignInResult(Outcome.WRONG, user=user)

    cleared = after_success(state)
    user.failed_logins, user.locked_until = cleared.failures, cleared.locked_until
    user.last_login_at = now
    if passwords.needs_rehash(user.password_hash):
        user.password_hash = passwords.hash(password)
    if old_token:
        session.execute(sa.delete(StaffSession).where(StaffSession.id == session_id(old_token)))
    token = _start_session(session, user, now=now, expires_at=now + policy.session_max)
    purge_expired(session, now=now, idle=policy.session_idle)
    audit.record(session, user, Action.SIGNED_IN, target, at=now)
    return SignInResult(Outcome.SIGNED_IN, token=token, user=user)


def _count_failure(
    session: Session,
    user: StaffUser,
    state: LockState,
    now: dt.datetime,
    policy: StaffPolicy,
    actor: audit.Actor,
    action: str,
    *,
    reason: str = "wrong_password",
) -> LockState:
    """One failed password check on an account, at sign-in or on the password form:
    counted toward the lockout and audited, and the lock audited when it starts."""
    new = after_failure(state, now, policy.lockout)
    user.failed_logins, user.locked_until = new.failures, new.locked_until
    target = staff_target(user.email)
    audit.record(session, actor, action, target, {"reason": reason}, at=now)
    if new.is_locked(now):
        audit.record(
            session,
            None,
            Action.LOCKED_OUT,
            target,
            {"minutes": policy.lockout.duration // dt.timedelta(minutes=1)},
            at=now,
        )
    return new


def _unknown_email(
    session: Session, email: str, pepper: bytes, policy: StaffPolicy, now: dt.datetime
) -> SignInResult:
    """An email no account has gets the same lockout as an account, kept in the
    throttle table, so the answers never reveal whether an address is on staff."""
    row = _email_lock_row(session, throttle_key(pepper, ThrottleKind.EMAIL, email), now)
    state = LockState(row.attempts, row.locked_until)
    recorded = Anonymous(email if email_problem(email) is None else None)
    if state.is_locked(now):
        audit.record(session, recorded, Action.SIGN_IN_FAILED, None, {"reason": "locked"}, at=now)
        return SignInResult(Outcome.LOCKED, minutes=state.minutes_left(now))
    new = after_failure(state, now, policy.lockout)
    if state.failures == 0:
        row.window_started_at = now
    row.attempts, row.locked_until = new.failures, new.locked_until
    audit.record(
        session, recorded, Action.SIGN_IN_FAILED, None, {"reason": "unknown_email"}, at=now
    )
    if new.is_locked(now):
        return SignInResult(Outcome.LOCKED, minutes=new.minutes_left(now))
    return SignInResult(Outcome.WRONG)


# -- sessions -----------------------------------------------------------------------------


def authenticate(
    session: Session, token: str | None, *, policy: StaffPolicy, now: dt.datetime
) -> SignedIn | None:
    """The member of staff a session cookie belongs to, or None (and an expired session
    is deleted). Each use moves the idle deadline on."""
    if not token or len(token) > 128:
        return None
    row = session.execute(
        sa.select(StaffSession, StaffUser)
        .join(StaffUser, StaffUser.id == StaffSession.staff_user_id)
        .where(StaffSession.id == session_id(token))
    ).one_or_none()
    if row is None:
        return None
    staff_session, user = row
    if (
        now >= staff_session.expires_at
        or now >= staff_session.last_seen_at + policy.session_idle
        or user.disabled_at is not None
    ):
        session.delete(staff_session)
        return None
    staff_session.last_seen_at = now
    return SignedIn(
        id=user.id,
        email=user.email,
        roles=user.roles,
        session_id=staff_session.id,
        must_replace_password=user.must_replace_password,
    )


def sign_out(session: Session, signed_in: SignedIn, *, now: dt.datetime) -> None:
    session.execute(sa.delete(StaffSession).where(StaffSession.id == signed_in.session_id))
    audit.record(session, signed_in, Action.SIGNED_OUT, staff_target(signed_in.email), at=now)


def purge_expired(session: Session, *, now: dt.datetime, idle: dt.timedelta) -> None:
    """Delete sessions past either deadline and throttle rows that no longer matter."""
    session.execute(
        sa.delete(StaffSession).where(
            sa.or_(StaffSession.expires_at <= now, StaffSession.last_seen_at <= now - idle)
        )
    )
    lock_over = sa.or_(
        StaffLoginThrottle.locked_until.is_(None), StaffLoginThrottle.locked_until <= now
    )
    session.execute(
        sa.delete(StaffLoginThrottle).where(
            sa.or_(
                sa.and_(
                    StaffLoginThrottle.kind == ThrottleKind.ADDRESS.value,
                    StaffLoginThrottle.window_started_at <= now - _ADDRESS_WINDOW,
                ),
                sa.and_(
                    StaffLoginThrottle.kind == ThrottleKind.EMAIL.value,
                    lock_over,
                    sa.or_(
                        StaffLoginThrottle.attempts == 0,
                        StaffLoginThrottle.window_started_at <= now - _EMAIL_STREAK_RETENTION,
                    ),
                ),
            )
        )
    )
