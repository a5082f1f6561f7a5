"""llmgw_append deletes the rows of the ended replicas an operator forgot

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 09:30:00

The ``replicas`` and ``shards`` tables kept a row for every replica that ever ran: the fold
forgets ended replicas past a few per model, but nothing removed a row, and a fleet that
scales to zero and back and rolls out revisions ends thousands a day. An operator now
forgets those that ended at or before a cutoff with an event, ``ended_replicas_forgotten``
(one per model, on its stream: ``app/domain/replica_retention.py``). The fold forgets them
(``app/domain/evolve/replicas.py``), those it held and those it had forgotten already; but
the caller's fold no longer knows the ids of the replicas it forgot long ago, and so cannot
name their rows. The function deletes them itself, for each such event of the batch: every
row of the event's model whose phase is ended and that ended at or before the cutoff, and
their shards (the foreign key cascades). It does so before it writes the rows of the
entities the batch touched, which are the fold's after every event of the batch. A cutoff
written without an offset is a UTC time, as the fold reads it.

No new parameter and no new check: the rows deleted are implied by an event in the log,
as ``projections rebuild`` implies them, and a role that may append could append the event
anyway. The signature and the result are 0017's, so the function is replaced in place and
every grant on it stays. Downgrading restores 0017's text; the event then deletes no row,
and ``projections rebuild`` removes the rows an older release left behind.
"""

from collections.abc import Sequence
from types import ModuleType

from alembic import context, op
from sqlalchemy import text

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (0017's text, this revision's): a variable, and the deletion before the touched replicas'
# rows are replaced.
CHANGES = (
    (
        "    v_stray record;\n",
        "    v_stray record;\n    v_forget record;\n",
    ),
    (
        "    IF cardinality(p_touched_replicas) > 0 THEN\n",
        """    -- Ended replicas an operator forgot (ended_replicas_forgotten): every row of the
    -- model's replicas that ended at or before the cutoff, those the caller's fold forgot
    -- long ago (it knows their ids no more) as well as those it held, with their shards.
    -- Before the touched rows are written: those are the fold's after the whole batch.
    FOR v_forget IN
        SELECT p_data[i]->>'model' AS model,
               CASE WHEN p_data[i]->>'before' ~ '(Z|[+-][0-9][0-9](:?[0-9][0-9])?)$'
                    THEN (p_data[i]->>'before')::timestamptz
                    ELSE (p_data[i]->>'before')::timestamp AT TIME ZONE 'UTC'
               END AS before
        FROM generate_subscripts(p_type, 1) AS i
        WHERE p_type[i] = 'ended_replicas_forgotten'
        ORDER BY i
    LOOP
        DELETE FROM replicas
        WHERE model COLLATE "C" = v_forget.model
          AND phase IN ('stopped', 'failed', 'timed_out', 'lost')
          AND ended_at <= v_forget.before;
    END LOOP;

    IF cardinality(p_touched_replicas) > 0 THEN
""",
    ),
)


def upgrade() -> None:
    op.execute(_function(changed=True))


def downgrade() -> None:
    op.execute(_function(changed=False))


def _function(*, changed: bool) -> str:
    """0017's ``llmgw_append``, with this revision's changes when ``changed``. ``CREATE OR
    REPLACE`` keeps the function, and so every grant on it."""
    chained = _revision("0005")
    definition: str = chained.APPEND_FUNCTION
    earlier = _revision("0016").CHANGES + _revision("0017").CHANGES
    for old, new in earlier + (CHANGES if changed else ()):
        definition = _replaced_once(definition, old, new)
    schema = op.get_bind().execute(text("SELECT quote_ident(current_schema())")).scalar_one()
    return definition.format(schema=schema, genesis=chained.GENESIS)


def _revision(name: str) -> ModuleType:
    script = context.script.get_revision(name)
    assert script is not None, f"revision {name} defines what llmgw_append is built from"
    return script.module


def _replaced_once(source: str, old: str, new: str) -> str:
    if source.count(old) != 1:
        raise RuntimeError(f"expected {old!r} exactly once in llmgw_append")
    return source.replace(old, new)
