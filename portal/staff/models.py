"""Staff accounts, their roles, server-side sessions, sign-in throttles and the audit trail."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

from portal.db import Base, UTCDateTime, uuid7


class Role(enum.StrEnum):
    ADMIN = "admin"
    COMPLIANCE = "compliance"
    CAMPAIGNS = "campaigns"


ROLE_CHECK = "role IN ('admin', 'compliance', 'campaigns')"


class StaffUser(Base):
    """A member of staff. Never deleted (the audit trail refers to it): disabled instead."""

    __tablename__ = "staff_user"

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid7)
    email: Mapped[str] = mapped_column(sa.String(254), nullable=False, unique=True)
    password_hash: Mapped[str] = mapped_column(sa.String(255), nullable=False)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    disabled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    failed_logins: Mapped[int] = mapped_column(
        sa.SmallInteger, nullable=False, default=0, server_default="0"
    )
    locked_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_login_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # Someone else chose the password (an admin, or whoever ran ``portal create-staff``):
    # the person replaces it at first sign-in before any other staff page opens.
    must_replace_password: Mapped[bool] = mapped_column(
        sa.Boolean, nullable=False, default=False, server_default=sa.false()
    )

    role_rows: Mapped[list[StaffRole]] = relationship(
        back_populates="user", cascade="all, delete-orphan", lazy="selectin"
    )

    __table_args__ = (
        # Lookups are by the lowercased address; the database keeps it that way.
        sa.CheckConstraint("email = lower(email)", name="email_lowercase"),
        sa.CheckConstraint("failed_logins >= 0", name="failed_logins_not_negative"),
    )

    @property
    def roles(self) -> frozenset[Role]:
        return frozenset(Role(r.role) for r in self.role_rows)

    def set_roles(self, roles: frozenset[Role]) -> None:
        keep = [r for r in self.role_rows if r.role in roles]
        have = {r.role for r in keep}
        self.role_rows = keep + [StaffRole(role=role.value) for role in sorted(roles - have)]


class StaffRole(Base):
    """One row per (staff user, role): a CHECK on a plain column works alike on both
    databases, and "who holds role X" is an indexed query rather than string parsing."""

    __tablename__ = "staff_role"

    staff_user_id: Mapped[uuid.UUID] = mapped_column(
        sa.Uuid, sa.ForeignKey("staff_user.id", ondelete="CASCADE"), primary_key=True
    )
    role: Mapped[str] = mapped_column(sa.String(16), primary_key=True)

    user: Mapped[StaffUser] = relationship(back_populates="role_rows")

    __table_args__ = (
        sa.CheckConstraint(ROLE_CHECK, name="role"),
        sa.Index("ix_staff_role_role", "role"),
    )


class StaffSession(Base):
    """A signed-in browser. The cookie holds a random token; only its SHA-256 is stored,
    so a copy of this table cannot be replayed as cookies."""

    __tablename__ = "staff_session"

    id: Mapped[bytes] = mapped_column(sa.LargeBinary(32), primary_key=True)
    staff_user_id: Mapped[uuid.UUID] = mapped_column(
        sa.Uuid, sa.ForeignKey("staff_user.id", ondelete="CASCADE"), nullable=False
    )
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    last_seen_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)

    __table_args__ = (
        sa.CheckConstraint("length(id) = 32", name="id_len"),
        sa.Index("ix_staff_session_staff_user_id", "staff_user_id"),
        sa.Index("ix_staff_session_expires_at", "expires_at"),
    )


class ThrottleKind(enum.StrEnum):
    ADDRESS = "address"  # attempts per minute from one client address
    EMAIL = "email"  # the lockout of an address that is no account (see services)


class StaffLoginThrottle(Base):
    """Sign-in counters keyed by an HMAC of the client address or the typed email, so
    neither is stored in the clear. Shared by every process through the database."""

    __tablename__ = "staff_login_throttle"

    key: Mapped[bytes] = mapped_column(sa.LargeBinary(32), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(8), nullable=False)
    attempts: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    window_started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    locked_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        sa.CheckConstraint("kind IN ('address', 'email')", name="kind"),
        sa.CheckConstraint("attempts >= 0", name="attempts_not_negative"),
        sa.CheckConstraint("length(key) = 32", name="key_len"),
    )


class StaffAudit(Base):
    """What staff did, append-only: the database refuses UPDATE and DELETE (triggers)."""

    __tablename__ = "staff_audit"

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    # RESTRICT (the default): a staff user with an audit trail cannot be deleted, and
    # SET NULL would be an UPDATE the trigger refuses anyway.
    actor_id: Mapped[uuid.UUID | None] = mapped_column(sa.Uuid, sa.ForeignKey("staff_user.id"))
    actor_email: Mapped[str | None] = mapped_column(sa.String(254))
    action: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    target: Mapped[str | None] = mapped_column(sa.String(255))
    detail: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    # "cli" for a ``portal …`` command, with the operating-system user who ran it.
    actor_via: Mapped[str | None] = mapped_column(sa.String(16))
    actor_os_user: Mapped[str | None] = mapped_column(sa.String(64))

    __table_args__ = (
        sa.Index("ix_staff_audit_at", "at"),
        sa.Index("ix_staff_audit_action", "action", "id"),
        sa.Index("ix_staff_audit_actor_email", "actor_email", "id"),
    )
