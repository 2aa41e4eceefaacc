"""The ``delivery`` table's monthly partitions on PostgreSQL (migration 0031).

``delivery`` grows by the audience with every campaign. On PostgreSQL it is partitioned
by range of ``campaign_id``: campaign ids are UUIDv7, whose first 48 bits are the
milliseconds of their creation, so a month is the id range from the lowest id of its
first millisecond to the lowest of the next month's, and every delivery of a campaign lands
in the partition of the month the campaign was created in. A partition named
``delivery_YYYY_MM`` holds a month; ``delivery_default`` holds any id outside them (ids
that are not UUIDv7, or a month whose partition is missing).

- :func:`create_ahead` makes this month's partition and the next ``AHEAD_MONTHS``' (the
  ``table-retention`` job, every run). If the default partition already holds rows of a
  month (the job did not run for months), they move into the new partition.
- :func:`droppable` names the months whose every campaign finished before the delivery
  retention's cutoff; :func:`drop` folds each of their campaigns into its counters in a
  few set-wise statements (:func:`portal.campaigns.tally.fold_campaign`), deletes their
  display receipts and drops the partition, in one transaction — no row is deleted one by
  one and almost no WAL is written (docs/operations.md#bounded-tables).
- A month is left to its drop (:func:`spared`): the row-by-row fold
  (``portal.retention.tables.fold_deliveries``) takes only campaigns outside every month
  partition, and those of a month that a campaign still running held past its drop by
  more than a month.

On SQLite ``delivery`` is one table and none of this applies (:func:`partitioned`).
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from portal.campaigns import tally
from portal.campaigns.models import Campaign
from portal.db import is_postgres
from portal.delivery.models import Delivery

_d = cast(sa.Table, Delivery.__table__)
_c = cast(sa.Table, Campaign.__table__)

# This month and the next two always have their partition, so a campaign created before
# the next run of the job lands in its month, not in the default partition.
AHEAD_MONTHS = 2
# The advisory lock (portal.db.held_transaction_lock) of the process making and dropping
# partitions: one at a time ("dpart").
MAINTENANCE_LOCK = 0x6470617274
_NAME = re.compile(r"delivery_(\d{4})_(\d{2})")
# Where a delivery row lies: its partition and its place in it.
_PARTITION: sa.ColumnClause[Any] = sa.column("tableoid", _selectable=_d)
_PLACE: sa.ColumnClause[Any] = sa.column("ctid", _selectable=_d)


def picked(
    session: Session, choose: sa.Select[Any], campaign_id: uuid.UUID
) -> sa.ColumnElement[bool]:
    """The condition by which an UPDATE of ``delivery`` finds the rows ``choose`` (a
    select of one campaign's delivery ids, ordered and limited) picks, each locked as it
    is picked, rows another transaction holds passed by (PostgreSQL: SKIP LOCKED; SQLite's
    write lock, taken when the transaction began, serialises writers).

    On PostgreSQL the rows are chosen once (a materialised CTE: as a subquery of an
    update of the partitioned table its LIMIT would hold per partition scanned) and
    found again by their place, not by id: for a campaign newer than the table's
    statistics the planner believed the campaign empty and read all of it for each row
    of the batch (1.9 s a claim at 45,000 rows)."""
    if not is_postgres(session):
        return _d.c.id.in_(choose.scalar_subquery())
    chosen = (
        choose.with_only_columns(_PARTITION.label("partition"), _PLACE.label("place"))
        .with_for_update(of=_d, skip_locked=True)
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    return sa.and_(
        chosen.c.place == _PLACE,
        chosen.c.partition == _PARTITION,
        _d.c.campaign_id == campaign_id,
    )


def bound(at: dt.datetime) -> uuid.UUID:
    """The lowest UUIDv7 of the millisecond ``at``: every id made at or after ``at``
    sorts at or above it (PostgreSQL compares uuids byte by byte, most significant first)."""
    return uuid.UUID(int=int(at.timestamp() * 1000) << 80)


@dataclass(frozen=True, order=True)
class Month:
    """A calendar month (UTC) and its partition."""

    year: int
    month: int

    @classmethod
    def of(cls, when: dt.datetime) -> Month:
        when = when.astimezone(dt.UTC)
        return cls(when.year, when.month)

    @property
    def name(self) -> str:
        return f"delivery_{self.year:04d}_{self.month:02d}"

    @property
    def start(self) -> dt.datetime:
        return dt.datetime(self.year, self.month, 1, tzinfo=dt.UTC)

    @property
    def end(self) -> dt.datetime:
        return self.next().start

    def next(self) -> Month:
        return Month(self.year + self.month // 12, self.month % 12 + 1)

    def ids(self) -> sa.ColumnElement[bool]:
        """The campaign ids made in this month."""
        return sa.and_(_c.c.id >= bound(self.start), _c.c.id < bound(self.end))

    def deliveries(self) -> sa.ColumnElement[bool]:
        """This month's deliveries: the partition's range (PostgreSQL prunes to it)."""
        return sa.and_(_d.c.campaign_id >= bound(self.start), _d.c.campaign_id < bound(self.end))


def is_partition(table: str) -> bool:
    """Whether ``table`` names one of delivery's partitions (made at run time, so no
    model declares them)."""
    return table == "delivery_default" or _NAME.fullmatch(table) is not None


def partitioned(session: Session) -> bool:
    """Whether ``delivery`` is partitioned here (PostgreSQL, migration 0031 applied)."""
    if not is_postgres(session):
        return False
    kind = session.execute(
        sa.text("SELECT relkind FROM pg_class WHERE oid = to_regclass('delivery')")
    ).scalar()
    return kind == "p"


def months(session: Session) -> list[Month]:
    """The month partitions attached to ``delivery``, oldest first."""
    if not partitioned(session):
        return []
    names = session.execute(
        sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'delivery'::regclass"
        )
    ).scalars()
    found = [_NAME.fullmatch(name) for name in names]
    return sorted(Month(int(m[1]), int(m[2])) for m in found if m)


# The default partition's rows of a month (delivery_default is made by migration 0031).
_IN_DEFAULT = sa.text(
    "SELECT count(*) FROM delivery_default WHERE campaign_id >= :low AND campaign_id < :high"
)
_MOVE_OUT = sa.text(
    "CREATE TEMPORARY TABLE moving ON COMMIT DROP AS SELECT * FROM delivery_default"
    " WHERE campaign_id >= :low AND campaign_id < :high"
)
_DELETE_FROM_DEFAULT = sa.text(
    "DELETE FROM delivery_default WHERE campaign_id >= :low AND campaign_id < :high"
)


def _lock_timeout(session: Session, milliseconds: int) -> None:
    # A statement waiting for ACCESS EXCLUSIVE queues every later one behind it: give up
    # after this long (the job's next run tries again) rather than stall sending.
    session.execute(sa.text(f"SET LOCAL lock_timeout = {int(milliseconds)}"))


def create(session: Session, month: Month, *, lock_timeout_ms: int) -> int:
    """Make ``month``'s partition; the rows of that month the default partition held
    move into it. How many moved. The caller's transaction; ``delivery`` is held
    exclusively until it commits, so no statement sees a moved row twice or not at all."""
    _lock_timeout(session, lock_timeout_ms)
    session.execute(sa.text("LOCK TABLE delivery IN ACCESS EXCLUSIVE MODE"))
    if month in months(session):
        return 0  # made meanwhile (by a migration)
    low, high = bound(month.start), bound(month.end)
    values = {"low": low, "high": high}
    moved = session.execute(_IN_DEFAULT, values).scalar_one()
    if moved:
        session.execute(_MOVE_OUT, values)
        session.execute(_DELETE_FROM_DEFAULT, values)
    session.execute(
        sa.text(
            f"CREATE TABLE {month.name} PARTITION OF delivery"
            f" FOR VALUES FROM ('{low}') TO ('{high}')"
        )
    )
    if moved:
        session.execute(sa.text("INSERT INTO delivery SELECT * FROM moving"))
    return int(moved)


def create_ahead(session: Session, now: dt.datetime, *, lock_timeout_ms: int) -> list[Month]:
    """This month's partition and the next ``AHEAD_MONTHS``', those missing; the ones made."""
    if not partitioned(session):
        return []
    have = set(months(session))
    wanted = [Month.of(now)]
    for _ in range(AHEAD_MONTHS):
        wanted.append(wanted[-1].next())
    made = [m for m in wanted if m not in have]
    for month in made:
        create(session, month, lock_timeout_ms=lock_timeout_ms)
    return made


def droppable(session: Session, now: dt.datetime, cutoff: dt.datetime) -> list[Month]:
    """Past months whose every campaign finished before ``cutoff``, oldest first. A
    month's campaigns are the ids in its range, so a campaign scheduled far ahead, or one
    still sending, keeps its month's partition."""
    this_month = Month.of(now)
    found = []
    for month in months(session):
        if month >= this_month or month.start >= cutoff:
            continue  # a campaign may still be made in it, or none can have finished
        kept = session.execute(
            sa.select(
                sa.exists().where(
                    month.ids(),
                    sa.or_(
                        _c.c.status.not_in(tally.FINISHED),
                        _c.c.finished_at.is_(None),
                        _c.c.finished_at >= cutoff,
                    ),
                )
            )
        ).scalar()
        if not kept:
            found.append(month)
    return found


def drop(session: Session, month: Month, *, lock_timeout_ms: int) -> int:
    """Fold every campaign of ``month`` into its counters, delete their display receipts
    and drop the partition; how many deliveries it held. One transaction (the caller's),
    so a delivery is counted exactly when its partition is gone: if the drop cannot have
    its lock in ``lock_timeout_ms``, nothing of it is kept."""
    if month not in months(session):
        return 0  # dropped meanwhile
    campaigns = list(
        session.execute(sa.select(_d.c.campaign_id).where(month.deliveries()).distinct()).scalars()
    )
    deliveries = sum(tally.fold_campaign(session, campaign_id) for campaign_id in campaigns)
    _lock_timeout(session, lock_timeout_ms)
    session.execute(sa.text(f"DROP TABLE {month.name}"))
    for campaign_id in campaigns:
        tally.compact(session, campaign_id)
    return deliveries


def spared(session: Session, now: dt.datetime, cutoff: dt.datetime) -> list[Month]:
    """Month partitions the row-by-row fold leaves alone, to be dropped whole: those
    that may be dropped now (a drop that could not have its lock is tried again by the
    next run), and those that ended in ``cutoff``'s month or later (most months' last
    campaign finishes within weeks of the month's end). A month still here once the
    cutoff is a calendar month further on is held by a campaign that ran long: its
    finished campaigns are folded row by row meanwhile."""
    grace = Month.of(cutoff)
    whole = set(droppable(session, now, cutoff))
    return [month for month in months(session) if month in whole or month.next() >= grace]
