"""A/B variants: campaign.variants and delivery.variant.

A campaign may carry two or three variants of its title, message and image
(``campaign.variants``, a JSON list in order A, B, C; the campaign's own title, message
and image are variant A's). Each delivery records the variant its subscription was given
(``delivery.variant``, 0 = A), chosen when the audience is materialised from the
subscription id, so the split is random and stable (portal/campaigns/variants.py). NULL
for campaigns without variants and for everything sent before.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("campaign", sa.Column("variants", sa.JSON(), nullable=True))
    op.add_column("delivery", sa.Column("variant", sa.SmallInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("delivery") as batch:
        batch.drop_column("variant")
    with op.batch_alter_table("campaign") as batch:
        batch.drop_column("variants")
