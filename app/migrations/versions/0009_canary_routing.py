"""Canary routing: a model's canary split, and the revision of each route

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 14:00:00

``models.canary_revision`` and ``models.canary_traffic``: while a rollout's canary step
sends a share of the model's requests to the replicas of its new revision, that revision
and that share (0 to 1]; both NULL otherwise (``Model.canary``). The ``routing_table`` view
gains ``revision``, the revision each route's replica was placed with, so a gateway can
split a model's routes into the canary's and the others (docs/gateway.md).

Existing rows get NULL, no canary, which is what a replay gives a model that is in no
canary step. A model whose rollout is in a canary step while the database is upgraded
keeps NULL until its next event rewrites its row; ``llmgw-server projections rebuild``
writes it at once (``--verify`` names the row).

``CREATE OR REPLACE VIEW`` may only add columns at the end and keeps the view's
privileges; the downgrade drops it and creates it as revision 0001 did, then grants the
runtime roles their SELECT on it again (``app/store/grants.py``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.store.grants import grant_runtime_privileges

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ROUTING_TABLE = """
CREATE OR REPLACE VIEW routing_table AS
SELECT r.id AS replica_id, r.model, s.node_id, n.address, s.port,
       coalesce(r.weight, m.weight) AS weight,
       coalesce(r.target_waiting, m.target_waiting) AS target_waiting,
       coalesce(r.kv_ceiling, m.kv_ceiling) AS kv_ceiling,
       r.phase = 'draining' AS draining{extra}
FROM replicas r
JOIN models m ON m.name = r.model
JOIN shards s ON s.replica_id = r.id AND s.shard_index = 0
JOIN nodes n ON n.id = s.node_id
WHERE r.routable
"""


def upgrade() -> None:
    op.add_column("models", sa.Column("canary_revision", sa.Integer(), nullable=True))
    op.add_column("models", sa.Column("canary_traffic", sa.Float(), nullable=True))
    op.execute(_ROUTING_TABLE.format(extra=",\n       r.revision"))


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS routing_table")
    op.execute(_ROUTING_TABLE.format(extra=""))
    grant_runtime_privileges(op.get_bind())
    op.drop_column("models", "canary_traffic")
    op.drop_column("models", "canary_revision")
