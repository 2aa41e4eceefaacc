"""campaign_draft, and rich notifications on campaign (image, badge, actions, flags).

``campaign_draft`` keeps a campaign form as it was typed until it is launched: a new
table, so the engine's queries on ``campaign`` never meet a draft. Its ``version`` makes
every save and the launch conditional (nothing overwrites what another tab did).

``campaign.image`` / ``badge`` / ``actions``: nullable columns without a default;
``require_interaction`` / ``silent``: NOT NULL with a constant default (PostgreSQL keeps it
in the catalogue): no table rewrite.

``delivery_receipt.event`` may also be ``action-1`` / ``action-2``: a click on one of a
notification's buttons, a receipt of its own. The CHECK only widens, so no existing row
can break it: on PostgreSQL it is added back ``NOT VALID`` (no scan under the lock) and
validated in a transaction of its own. On SQLite the table is copied (batch mode).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def _when() -> sa.DateTime:
    return sa.DateTime(timezone=True)


_EVENTS_BEFORE = "event IN ('shown', 'clicked')"
_EVENTS_AFTER = "event IN ('shown', 'clicked', 'action-1', 'action-2')"


def _receipt_events(condition: str, *, not_valid: bool) -> None:
    name = "ck_delivery_receipt_event"
    if op.get_context().dialect.name == "postgresql":
        op.drop_constraint(op.f(name), "delivery_receipt", type_="check")
        op.execute(
            f"ALTER TABLE delivery_receipt ADD CONSTRAINT {name} CHECK ({condition})"
            + (" NOT VALID" if not_valid else "")
        )
        if not_valid:
            # Validated in a transaction of its own (SHARE UPDATE EXCLUSIVE: reads and
            # writes go on), as migrations/README.md does it.
            with op.get_context().autocommit_block():
                op.execute(f"ALTER TABLE delivery_receipt VALIDATE CONSTRAINT {name}")
        return
    with op.batch_alter_table("delivery_receipt", recreate="always") as batch:
        batch.drop_constraint(op.f(name), type_="check")
        batch.create_check_constraint(op.f(name), condition)


def upgrade() -> None:
    _receipt_events(_EVENTS_AFTER, not_valid=True)
    op.add_column("campaign", sa.Column("image", sa.String(2048), nullable=True))
    op.add_column("campaign", sa.Column("badge", sa.String(2048), nullable=True))
    op.add_column("campaign", sa.Column("actions", sa.JSON(), nullable=True))
    op.add_column(
        "campaign",
        sa.Column("require_interaction", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.add_column(
        "campaign", sa.Column("silent", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.create_table(
        "campaign_draft",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("fields", sa.JSON(), nullable=False),
        sa.Column("title", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("updated_by", sa.String(255), nullable=False),
        sa.Column("updated_at", _when(), nullable=False),
        sa.Column("cloned_from", sa.Uuid(), nullable=True),
        sa.Column("launched_campaign_id", sa.Uuid(), nullable=True),
        sa.Column("launched_by", sa.String(255), nullable=True),
        sa.Column("launched_at", _when(), nullable=True),
        sa.CheckConstraint("version >= 1", name=op.f("ck_campaign_draft_version")),
        sa.ForeignKeyConstraint(
            ["cloned_from"], ["campaign.id"], name=op.f("fk_campaign_draft_cloned_from_campaign")
        ),
        sa.ForeignKeyConstraint(
            ["launched_campaign_id"],
            ["campaign.id"],
            name=op.f("fk_campaign_draft_launched_campaign_id_campaign"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_campaign_draft")),
        sa.UniqueConstraint(
            "launched_campaign_id", name=op.f("uq_campaign_draft_launched_campaign_id")
        ),
    )
    op.create_index("ix_campaign_draft_updated_at", "campaign_draft", ["updated_at"])


def downgrade() -> None:
    op.execute("DELETE FROM delivery_receipt WHERE event IN ('action-1', 'action-2')")
    _receipt_events(_EVENTS_BEFORE, not_valid=False)
    op.drop_index("ix_campaign_draft_updated_at", table_name="campaign_draft")
    op.drop_table("campaign_draft")
    op.drop_column("campaign", "silent")
    op.drop_column("campaign", "require_interaction")
    op.drop_column("campaign", "actions")
    op.drop_column("campaign", "badge")
    op.drop_column("campaign", "image")
