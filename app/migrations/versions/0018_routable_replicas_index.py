"""ix_replicas_routable: the routable replicas, whatever the projection's history

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07 06:40:00

The projection keeps a row in ``replicas`` (and its ``shards``) for every replica that ever
ran, so a fleet that scales to zero and back and rolls out daily piles up ended replicas
for ever, while the routes are only the routable ones. A gateway reads every route once
per connection and every 30 s (``app/store/routing_rows.py``); without an index on
``routable`` that read scanned every replica the projection ever held. This partial index
holds the routable replicas alone (their model and id, a few dozen bytes each), so the
read finds them without passing over the ended ones, and its own count of entries tells
the read when looking up each one's first shard by the shards' primary key costs less than
scanning every shard (docs/performance.md, "A read of every route and the projection's
history"). By model first: a read of what changed reads the routes of every routable
replica of a model an event names, which ``ix_replicas_model`` found among all of that
model's replicas, ended ones too.

It is built in the migration's transaction (a plain ``CREATE INDEX``: ``CONCURRENTLY``
cannot run in one), holding writes to ``replicas`` while it is built: 61 ms at 220,000
replicas on a small machine. The runtime role reads through the table's
grants; an index needs none. Downgrading drops it; a gateway of this version reads every
route by scanning the shards then, as before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_replicas_routable",
        "replicas",
        ["model", "id"],
        postgresql_where=sa.text("routable"),
    )


def downgrade() -> None:
    op.drop_index("ix_replicas_routable", table_name="replicas")
