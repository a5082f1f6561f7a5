"""gateway_reports.instance: which gateway process wrote each report

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 01:30:00

Two gateway processes started with the same ``--gateway-id`` (or ``serve --server-id``)
used to overwrite one row, each replacing the other's requests in flight twice a second:
the leader read about half the demand and could scale a busy model down, or a model one of
them serves to zero. Each process now writes its report with a token of its own
(hostname, pid and a random part) in ``instance``, and overwrites only a row it wrote
itself or one no gateway has written for ``REPORT_MAX_AGE_S`` (its previous life's); a
process that finds its id's row held by another live report writes under a key of its own
(``ID@INSTANCE``), so the leader sums both, and says so (``app/gateway/reporter.py``).
Nullable: a gateway that predates this revision writes no token, and its row stays as it
was. The runtime role already may write the table's rows (``app/store/grants.py``); a new
column needs nothing more.

Upgrade the database before the gateways: a gateway of this version writes the column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("gateway_reports", sa.Column("instance", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("gateway_reports", "instance")
