"""Model failure backoff and replica drain start, for the reconciler

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 16:05:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("models", sa.Column("failures", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("models", sa.Column("backoff_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "replicas", sa.Column("drain_started_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("replicas", "drain_started_at")
    op.drop_column("models", "backoff_until")
    op.drop_column("models", "failures")
