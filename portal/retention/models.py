"""Aggregates that purged tombstones are folded into."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from portal.db import Base


class RetentionCounter(Base):
    """How many subscriptions ended, by month of ending, push service and how they ended."""

    __tablename__ = "retention_counter"

    month: Mapped[str] = mapped_column(sa.String(7), primary_key=True)  # YYYY-MM
    push_service: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    end_reason: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    count: Mapped[int] = mapped_column(sa.BigInteger, nullable=False, default=0)
