"""rate_budgets: the slices of keys' per-minute limits that gateways lease

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 12:00:00

Live state, not events: one row per key, resource (``rpm`` or ``tpm``) and second of the
database's clock, holding what gateways were granted of that key's limit in that second,
less what they returned unused (``app/store/rate_budgets.py``; the design is in
docs/gateway.md). A grant sums the key's rows of the last minute under an advisory lock;
rows older than two minutes are deleted by the grants of the same key. The runtime role
may insert, update and delete its rows (``TELEMETRY_TABLES`` in ``app/store/grants.py``,
granted by ``llmgw-server migrate`` after the upgrade).

Upgrade the database before the gateways: a gateway of this version leases from the table.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rate_budgets",
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("second", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("granted", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key_id", "resource", "second"),
    )


def downgrade() -> None:
    op.drop_table("rate_budgets")
