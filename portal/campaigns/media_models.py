"""The pictures staff upload for campaigns (portal/campaigns/media.py has the rules): a
leaf, like the test devices' tables."""

from __future__ import annotations

import datetime as dt
import uuid

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from portal.db import Base, UTCDateTime


class Picture(Base):
    """One uploaded picture, named by the SHA-256 of its bytes: the same file uploaded
    twice is one row and one address, and an address never changes what it serves."""

    __tablename__ = "campaign_picture"

    sha256: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    content_type: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    width: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    height: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    size: Mapped[int] = mapped_column(sa.Integer, nullable=False)
    data: Mapped[bytes] = mapped_column(sa.LargeBinary, nullable=False)
    uploaded_by: Mapped[uuid.UUID | None] = mapped_column(sa.Uuid, sa.ForeignKey("staff_user.id"))
    uploaded_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)

    __table_args__ = (
        sa.CheckConstraint(
            "content_type IN ('image/png', 'image/jpeg', 'image/gif', 'image/webp')",
            name="content_type",
        ),
        sa.CheckConstraint("length(sha256) = 64", name="sha256_len"),
    )
