"""Display receipts reported by the service worker."""

from __future__ import annotations

import datetime as dt
import enum

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from portal.db import Base, UTCDateTime


class ReceiptEvent(enum.StrEnum):
    """What the browser saw happen. A push service accepting a message (a 201) is a
    third, separate fact, recorded on the delivery itself, not here."""

    SHOWN = "shown"
    CLICKED = "clicked"


class DeliveryReceipt(Base):
    """One fact per (delivery, event): a repeated report is the same fact."""

    __tablename__ = "delivery_receipt"

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    # The id as the worker reported it (text, no foreign key); only ids of our
    # deliveries to the reporting browser are accepted (portal/delivery/receipts.py).
    delivery_id: Mapped[str] = mapped_column(sa.String(64), nullable=False)
    event: Mapped[str] = mapped_column(sa.String(16), nullable=False)
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    # Only the hash: a receipt never stores a credential.
    endpoint_hash: Mapped[bytes | None] = mapped_column(sa.LargeBinary(32))

    __table_args__ = (
        sa.UniqueConstraint("delivery_id", "event", name="uq_delivery_receipt_delivery_event"),
        sa.CheckConstraint("event IN ('shown', 'clicked')", name="event"),
        sa.CheckConstraint(
            "endpoint_hash IS NULL OR length(endpoint_hash) = 32", name="endpoint_hash_len"
        ),
    )
