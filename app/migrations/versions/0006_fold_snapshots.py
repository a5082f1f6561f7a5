"""fold_snapshots: the fold at a position, so that a start-up does not replay the whole log

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 09:00:00

A snapshot is a row of ``fold_snapshots`` and its bytes in ``fold_snapshot_chunks``
(``app/store/snapshot_table.py`` writes and reads them). Neither is projected from the
log: both are derived from it, and losing them costs one full replay. The runtime role may
insert and delete them, never update them (``app/store/grants.py``; ``llmgw-server
migrate`` grants that after the upgrade).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fold_snapshots",
        sa.Column("position", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("chain_hash", sa.LargeBinary(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("chunks", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column(
            "written_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("position"),
        sa.CheckConstraint("octet_length(chain_hash) = 32", name="fold_snapshots_chain_hash_check"),
        sa.CheckConstraint("octet_length(digest) = 32", name="fold_snapshots_digest_check"),
    )
    op.create_table(
        "fold_snapshot_chunks",
        sa.Column("position", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("chunk", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("position", "chunk"),
    )
    # Out of line and uncompressed: a start-up reads the whole snapshot, and pglz would
    # cost more time decompressing it than reading it does (docs/performance.md).
    op.execute("ALTER TABLE fold_snapshot_chunks ALTER COLUMN data SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table("fold_snapshot_chunks")
    op.drop_table("fold_snapshots")
