"""gateway_reports: the requests each gateway has in flight, by replica

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 18:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain table, not a projection of the log: in-flight counts are live telemetry, like
    # agents' heartbeats. Each gateway overwrites its own row twice a second; recording
    # that as events would flood the log with facts nobody needs to replay.
    op.create_table(
        "gateway_reports",
        sa.Column("gateway_id", sa.Text(), nullable=False),
        sa.Column("in_flight", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "reported_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("gateway_id"),
    )


def downgrade() -> None:
    op.drop_table("gateway_reports")
