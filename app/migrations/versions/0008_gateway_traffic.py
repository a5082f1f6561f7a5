"""gateway_reports.traffic: each gateway's per-replica request figures over its window

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 12:00:00

Live telemetry like ``in_flight`` beside it, written in the same statement at the same
cadence (``app/store/gateway_reports.py`` defines the document and bounds what a reader
accepts of it). Nullable: a row of a gateway that predates this revision has none, and a
reader skips it. The runtime role already may insert, update and delete the table's rows
(``app/store/grants.py``); a new column needs nothing more.

Upgrade the database before the gateways: a gateway of this version writes the column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "gateway_reports",
        sa.Column("traffic", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("gateway_reports", "traffic")
