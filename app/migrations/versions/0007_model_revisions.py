"""Model revisions: the revision of each model, and the one each replica was placed with

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 11:00:00

Events recorded before revisions existed read as revision 1 (``app/domain/revisions.py``),
so the rows projected from them are revision 1 too: the default fills them in place, and
``projections rebuild --verify`` finds them equal to a rebuild without rewriting a row.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("models", sa.Column("revision", sa.Integer(), nullable=False, server_default="1"))
    op.add_column(
        "replicas", sa.Column("revision", sa.Integer(), nullable=False, server_default="1")
    )


def downgrade() -> None:
    op.drop_column("replicas", "revision")
    op.drop_column("models", "revision")
