"""delivery partitioned by month of its campaign (PostgreSQL).

``delivery`` becomes a table partitioned by range of ``campaign_id``: campaign ids are
UUIDv7, so a month of campaigns is an id range, and a month whose campaigns all finished
more than DELIVERY_RETENTION_MONTHS ago is folded into its counters and dropped whole
(portal/delivery/partitions.py), not deleted row by row. The primary key becomes
(id, campaign_id): a partitioned table's unique keys hold its partition key; ids still
come from the one sequence, so an id alone still names one delivery.

Partitions made here: ``delivery_default`` (ids outside every month, such as ids that are
not UUIDv7), and a month from the oldest UUIDv7 campaign's month to two months ahead; the
``table-retention`` job makes the later ones. Existing rows are copied across, with every
index built once after the copy. On SQLite nothing changes.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-04
"""

from __future__ import annotations

import datetime as dt
import uuid

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

_COLUMNS = (
    "id, campaign_id, subscription_id, push_service, status, attempts, next_attempt_at,"
    " lease_expires_at, last_status_code, reason, consent_reason, consent_event_seq,"
    " updated_at, variant"
)
_STATUSES = "'queued', 'sending', 'accepted', 'failed', 'revoked', 'skipped'"


def _table(name: str, partitioned: bool) -> str:
    return f"""
CREATE TABLE {name} (
    id bigint NOT NULL DEFAULT nextval('delivery_id_seq'::regclass),
    campaign_id uuid NOT NULL,
    subscription_id uuid NOT NULL,
    push_service varchar(16) NOT NULL,
    status varchar(10) NOT NULL,
    attempts smallint NOT NULL,
    next_attempt_at timestamptz NOT NULL,
    lease_expires_at timestamptz,
    last_status_code smallint,
    reason varchar(64),
    consent_reason varchar(32) NOT NULL,
    consent_event_seq bigint,
    updated_at timestamptz NOT NULL,
    variant smallint
){" PARTITION BY RANGE (campaign_id)" if partitioned else ""}
"""


def _keys_and_indexes(primary_key: str) -> list[str]:
    """The constraints and indexes of migrations 0001-0026, under their names."""
    return [
        f"ALTER TABLE delivery ADD CONSTRAINT pk_delivery PRIMARY KEY ({primary_key})",
        "ALTER TABLE delivery ADD CONSTRAINT uq_delivery_campaign_subscription"
        " UNIQUE (campaign_id, subscription_id)",
        f"ALTER TABLE delivery ADD CONSTRAINT ck_delivery_status CHECK (status IN ({_STATUSES}))",
        "ALTER TABLE delivery ADD CONSTRAINT fk_delivery_campaign_id_campaign"
        " FOREIGN KEY (campaign_id) REFERENCES campaign (id)",
        "CREATE INDEX ix_delivery_claim ON delivery (campaign_id, status, next_attempt_at)",
        "CREATE INDEX ix_delivery_due ON delivery (next_attempt_at, id)"
        " WHERE status IN ('queued', 'sending')",
        "CREATE INDEX ix_delivery_subscription_sent ON delivery (subscription_id, updated_at)",
        "CREATE INDEX ix_delivery_consent_event_seq ON delivery (consent_event_seq)"
        " WHERE consent_event_seq IS NOT NULL",
    ]


def _bound(at: dt.datetime) -> uuid.UUID:
    # The lowest UUIDv7 of that millisecond (portal.delivery.partitions.bound).
    return uuid.UUID(int=int(at.timestamp() * 1000) << 80)


def _next(year: int, month: int) -> tuple[int, int]:
    return year + month // 12, month % 12 + 1


def _months(first: dt.datetime, last: dt.datetime) -> list[tuple[int, int]]:
    year, month = first.year, first.month
    found = []
    while (year, month) <= (last.year, last.month):
        found.append((year, month))
        year, month = _next(year, month)
    return found


def _start(year: int, month: int) -> dt.datetime:
    return dt.datetime(year, month, 1, tzinfo=dt.UTC)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    now = dt.datetime.now(dt.UTC)
    ahead = _start(*_next(*_next(now.year, now.month)))  # this month and the next two
    # The oldest campaign id of version 7 within the months made ahead.
    oldest = bind.execute(
        sa.text(
            "SELECT id FROM campaign WHERE substr(id::text, 15, 1) = '7' AND id < :after"
            " ORDER BY id LIMIT 1"
        ),
        {"after": _bound(_start(*_next(ahead.year, ahead.month)))},
    ).scalar()
    first = now
    if oldest is not None:
        first = min(now, dt.datetime.fromtimestamp((oldest.int >> 80) / 1000, dt.UTC))
    op.execute(_table("delivery_partitioned", partitioned=True))
    op.execute("CREATE TABLE delivery_default PARTITION OF delivery_partitioned DEFAULT")
    for year, month in _months(first, ahead):
        after = _next(year, month)
        op.execute(
            f"CREATE TABLE delivery_{year:04d}_{month:02d} PARTITION OF delivery_partitioned"
            f" FOR VALUES FROM ('{_bound(_start(year, month))}')"
            f" TO ('{_bound(_start(*after))}')"
        )
    op.execute(
        f"INSERT INTO delivery_partitioned ({_COLUMNS}) SELECT {_COLUMNS} FROM delivery"  # noqa: S608
    )
    op.execute("ALTER SEQUENCE delivery_id_seq OWNED BY delivery_partitioned.id")
    op.execute("DROP TABLE delivery")
    op.execute("ALTER TABLE delivery_partitioned RENAME TO delivery")
    for statement in _keys_and_indexes("id, campaign_id"):
        op.execute(statement)
    op.execute("ANALYZE delivery")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute(_table("delivery_plain", partitioned=False))
    op.execute(f"INSERT INTO delivery_plain ({_COLUMNS}) SELECT {_COLUMNS} FROM delivery")  # noqa: S608
    op.execute("ALTER SEQUENCE delivery_id_seq OWNED BY delivery_plain.id")
    op.execute("DROP TABLE delivery")  # and every partition
    op.execute("ALTER TABLE delivery_plain RENAME TO delivery")
    for statement in _keys_and_indexes("id"):
        op.execute(statement)
