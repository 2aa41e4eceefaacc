"""The tables of test devices (portal/campaigns/testdevices.py has the rules): a leaf, so
the subscription registry can ask whether a browser's subscription is a test device
without importing the campaign code."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from portal.db import Base, UTCDateTime, uuid7

MAX_NAME = 60


class TestDevice(Base):
    """One browser of one member of staff, registered to receive tests."""

    __tablename__ = "staff_test_device"
    __test__ = False  # not a pytest test class, whatever its name

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    staff_user_id: Mapped[uuid.UUID] = mapped_column(
        sa.Uuid, sa.ForeignKey("staff_user.id"), nullable=False
    )
    name: Mapped[str] = mapped_column(sa.String(MAX_NAME), nullable=False)
    # The name compared (casefolded, NFKC): one person's names are unique this way.
    name_key: Mapped[str] = mapped_column(sa.String(MAX_NAME * 3), nullable=False)
    endpoint: Mapped[str] = mapped_column(sa.Text, nullable=False)
    endpoint_hash: Mapped[bytes] = mapped_column(sa.LargeBinary(32), nullable=False)
    push_service: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    p256dh: Mapped[str] = mapped_column(sa.String(96), nullable=False)
    auth_sealed: Mapped[bytes] = mapped_column(sa.LargeBinary(64), nullable=False)
    auth_key_version: Mapped[int] = mapped_column(sa.SmallInteger, nullable=False)
    user_agent: Mapped[str | None] = mapped_column(sa.String(400))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    last_tested_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_result: Mapped[str | None] = mapped_column(sa.String(16))
    last_status: Mapped[int | None] = mapped_column(sa.SmallInteger)
    # The push service said 404 or 410: this browser's subscription is no more.
    gone_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        sa.Index("ix_staff_test_device_name", "staff_user_id", "name_key", unique=True),
        sa.Index("ix_staff_test_device_endpoint", "staff_user_id", "endpoint_hash", unique=True),
        sa.CheckConstraint("length(endpoint_hash) = 32", name="endpoint_hash_len"),
        sa.CheckConstraint("last_result IN ('sent', 'gone', 'error')", name="last_result"),
    )

    @property
    def is_gone(self) -> bool:
        return self.gone_at is not None


class TestSend(Base):
    """One test send: the form as it was sent (to show the review page again) and what
    each device's push service answered. Also what the rate limit counts."""

    __tablename__ = "staff_test_send"
    __test__ = False

    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid7)
    staff_user_id: Mapped[uuid.UUID] = mapped_column(
        sa.Uuid, sa.ForeignKey("staff_user.id"), nullable=False
    )
    sent_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    fields: Mapped[dict[str, str]] = mapped_column(sa.JSON, nullable=False)
    # [{"device": id, "name": ..., "result": sent|gone|error, "detail": ...}], in order.
    outcomes: Mapped[list[dict[str, Any]]] = mapped_column(sa.JSON, nullable=False)

    __table_args__ = (sa.Index("ix_staff_test_send_staff_sent_at", "staff_user_id", "sent_at"),)
