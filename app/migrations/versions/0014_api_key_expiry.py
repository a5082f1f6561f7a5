"""api_keys.expires_at: when a key stops working

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 17:30:00

Projected from ``ApiKeyCreated.expires_at``: the time after which gateways refuse the key
(``app/domain/keys.py``; docs/gateway.md). No event marks the expiry, so the row keeps
the time, not whether it has passed. Nullable: a key that never expires. Every key created
before this revision never expires (its event has no ``expires_at``), so existing rows get
NULL, as a replay gives them, and ``projections rebuild --verify`` finds them equal without
rewriting a row. ``llmgw_append`` writes the projection's rows with
``jsonb_populate_recordset(NULL::api_keys, ...)``, which follows the table's columns, and the
runtime role's SELECT covers a new column: neither needs changing.

Upgrade the database before the servers and gateways: a gateway of this version reads the
column, and a server of this version writing to a table without it would drop the expiry
from the row.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("api_keys", "expires_at")
