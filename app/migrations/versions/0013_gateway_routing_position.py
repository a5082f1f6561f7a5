"""gateway_reports.routing_position: the routing table each gateway routes by

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 12:00:00

Written in the same statement as ``in_flight``: the log position of the routing table the
gateway had applied when it counted its requests in flight. A replica out of routing whose
leaving every live gateway has applied, and on which none has a request open, can stop
without waiting out the fixed quiesce time (``app.domain.reconcile``). Nullable: a row of
a gateway that predates this revision says nothing of its table, and the leader then waits
the quiesce time, as before. The runtime role already may write the table's rows
(``app/store/grants.py``); a new column needs nothing more.

Upgrade the database before the gateways: a gateway of this version writes the column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("gateway_reports", sa.Column("routing_position", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("gateway_reports", "routing_position")
