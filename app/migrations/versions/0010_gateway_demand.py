"""gateway_reports.queued: the requests each gateway holds waiting for a replica, by model

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 12:00:00

Live telemetry like ``in_flight`` and ``traffic`` beside it, written in the same statement
at the same cadence: per model, the requests the gateway holds in its queue, those waiting
for a saturated replica and those held while a model with an autoscaling policy starts
from zero. With the in-flight counts it is the demand the autoscaler reads
(``app/store/gateway_reports.py`` bounds what a reader accepts of it). Nullable: a row of a
gateway that predates this revision has none, and a reader counts nothing queued there.
The runtime role already may insert, update and delete the table's rows
(``app/store/grants.py``); a new column needs nothing more.

Upgrade the database before the gateways: a gateway of this version writes the column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "gateway_reports",
        sa.Column("queued", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("gateway_reports", "queued")
