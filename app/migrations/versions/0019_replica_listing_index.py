"""ix_replicas_listing: the replica list's order, so that a page costs a page

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07 07:10:00

The projection keeps a row in ``replicas`` for every replica that ever ran, and the admin
API lists them a page at a time (``GET /admin/v1/replicas?after=&limit=``), in one order:
model, then number, then id, byte by byte whatever the database's collation
(``app/store/replica_rows.py``). Without an index in that order, each page of the ended
replicas the fold forgot sorted every ended row that matched to keep its first few
hundred, so a page cost the whole history. With it, a page is read off the index in order,
after the page's start, and stops once the page is full (docs/performance.md, "A page of
the replica list").

Built in the migration's transaction (a plain ``CREATE INDEX``), holding writes to
``replicas`` while it is built. Its columns are written once, when a replica is placed, so
it costs appends one index entry a replica. Downgrading drops it; the list is then read
as before.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        'CREATE INDEX ix_replicas_listing ON replicas (model COLLATE "C", number, id COLLATE "C")'
    )


def downgrade() -> None:
    op.drop_index("ix_replicas_listing", table_name="replicas")
