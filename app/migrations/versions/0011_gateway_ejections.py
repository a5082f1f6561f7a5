"""gateway_reports.ejected: the replicas each gateway keeps out of its rotation

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 12:00:00

Live telemetry like ``in_flight``, ``traffic`` and ``queued`` beside it, written in the
same statement at the same cadence: the replicas the gateway has ejected for failing
requests in a row (cooling off, or waiting for a probe to succeed), each with its
ejections in a row (``app.gateway.ejection``). With the other fresh rows it says how many
live gateways eject a replica (``app/store/gateway_reports.py`` bounds what a reader
accepts of it). Nullable: a row of a gateway that predates this revision says nothing of
ejections, and is not counted among the gateways that could eject. The runtime role
already may insert, update and delete the table's rows (``app/store/grants.py``); a new
column needs nothing more.

Upgrade the database before the gateways: a gateway of this version writes the column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "gateway_reports",
        sa.Column("ejected", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("gateway_reports", "ejected")
