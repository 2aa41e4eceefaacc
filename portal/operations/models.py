"""When each job is due, and what each run did."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from portal.db import Base, UTCDateTime


class JobState(Base):
    """One row per job: the next time it is due, shared by every process."""

    __tablename__ = "job_state"

    name: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    next_run_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    last_started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


# The jobs page lists this many of the newest runs (portal/operations/views.py); the
# table-retention job never deletes them (portal/retention/tables.py).
RECENT_RUNS_LISTED = 100


class JobRun(Base):
    __tablename__ = "job_run"

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    name: Mapped[str] = mapped_column(sa.String(32), nullable=False)
    trigger: Mapped[str] = mapped_column(sa.String(16), nullable=False)  # scheduler | command
    host: Mapped[str] = mapped_column(sa.String(128), nullable=False)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    seconds: Mapped[float | None] = mapped_column(sa.Float)
    processed: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=0)
    changed: Mapped[int] = mapped_column(sa.Integer, nullable=False, default=0)
    error: Mapped[str | None] = mapped_column(sa.Text)

    __table_args__ = (sa.Index("ix_job_run_name_started_at", "name", "started_at"),)
