"""llmgw_append records the database's time and writes rows only of the events' entities

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 04:30:00

Two things a caller of ``llmgw_append`` could do that its events did not show:

- **Backdate the log.** Every event of an append is recorded at the time the caller gives
  (its fold already holds it: ``recorded_at`` decides timeouts, drains and rollouts), so a
  compromised server could record events at any time it liked, hours before they happened,
  and the chain would cover the lie. The function now refuses (``LG005``) a time more than
  ``SLACK_S`` seconds from the database's clock: before the statement began, or after the
  moment it is checked (after the append lock, which another append may have held). The
  log's times are the database's, give or take that much. Callers that may write the
  log's tables directly anyway (the owner and its members: a migration, a test, an
  import) are not bounded: the check would hold them to nothing.
- **Write projection rows that no event is about.** The function replaced the rows of the
  entities the caller named with the rows the caller sent, even for an append of no
  events: a runtime role could make ``models``, ``nodes``, ``replicas``, ``shards`` or
  ``api_keys`` say anything while the log gained nothing. Now every entity named and every
  row sent must be one the appended events are about, as the store's fold computes it
  (``app/store/projection.py``, ``Touched``): a node an event names; a replica an event
  names, or one the fold keeps as ended for a model that is touched (its row, sent or
  already stored, says that model); a model an event names, or the model of a replica an
  event names; a key an ``ApiKeyCreated`` or ``ApiKeyRevoked`` names (``key_id``). Rows of
  anything else are refused (``LG006``), and so is an append of no events with any row.
  The rows themselves are still the caller's: PostgreSQL cannot fold events, so a role that
  may append can still append an event about an entity and write a wrong row for it;
  ``projections rebuild --verify`` finds such rows. What it can no longer do is change a
  row without an event about that entity in the log.

The signature and the result are 0016's, so the function is replaced in place and every
grant on it stays. Downgrading restores 0016's text.
"""

from collections.abc import Sequence
from types import ModuleType

from alembic import context, op
from sqlalchemy import text

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SLACK_S = 60
"""How far the events' time may be from the database's clock: clocks kept by NTP agree to
within milliseconds; this leaves room for a slow network and a busy database, not for
rewriting the afternoon."""

# (0016's text, this revision's): the checks go before the first event is chained.
CHANGES = (
    (
        "    v_last_event_id uuid;\n",
        "    v_last_event_id uuid;\n    v_models text[];\n    v_stray record;\n",
    ),
    (
        "    FOR i IN 1 .. coalesce(cardinality(p_stream), 0) LOOP\n",
        """    -- The events' time is the caller's (its fold holds it already), but only within
    -- SLACK_S of the database's clock: a caller cannot backdate the log. One that may write
    -- the tables directly (the owner, a member of it) gains nothing from the bound.
    IF NOT pg_has_role(session_user, current_user, 'MEMBER')
       AND (p_recorded_at IS NULL
            OR p_recorded_at < statement_timestamp() - interval '@SLACK_S@ seconds'
            OR p_recorded_at > clock_timestamp() + interval '@SLACK_S@ seconds') THEN
        RAISE EXCEPTION 'the events'' time % is more than @SLACK_S@ s from the database''s clock, %',
            coalesce(p_recorded_at::text, 'none'), clock_timestamp()
            USING ERRCODE = 'LG005';
    END IF;

    -- Projection rows only of entities the appended events are about, as the caller's
    -- fold finds them (app/store/projection.py, Touched), so no row changes without an
    -- event about its entity in the log. Set differences and joins (hashed, not one array
    -- scan per element: a batch may hold thousands of events); only primary keys are
    -- looked up.
    v_models := ARRAY(
        SELECT m FROM unnest(p_model) AS m WHERE m IS NOT NULL
        UNION SELECT r.model FROM unnest(p_replica_id) AS i JOIN replicas r ON r.id = i
        UNION SELECT x->>'model' FROM jsonb_array_elements(p_rows->'replicas') AS x
              JOIN unnest(p_replica_id) AS i ON i = x->>'id');
    SELECT s.kind, s.name INTO v_stray FROM (
        SELECT 'model' AS kind, t AS name
        FROM (SELECT unnest(p_touched_models) EXCEPT SELECT unnest(v_models)) AS d(t)
        UNION ALL
        SELECT 'node', t
        FROM (SELECT unnest(p_touched_nodes) EXCEPT SELECT unnest(p_node_id)) AS d(t)
        UNION ALL
        SELECT 'replica', t
        FROM (SELECT unnest(p_touched_replicas) EXCEPT SELECT unnest(p_replica_id)) AS d(t)
        WHERE NOT EXISTS (SELECT 1 FROM replicas r WHERE r.id = t AND r.model = ANY(v_models))
          AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p_rows->'replicas') AS x
                          WHERE x->>'id' = t AND x->>'model' = ANY(v_models))
        UNION ALL
        SELECT 'key', t
        FROM (SELECT unnest(p_touched_keys)
              EXCEPT SELECT e->>'key_id' FROM unnest(p_data) AS e) AS d(t)
        UNION ALL
        SELECT 'model row', t
        FROM (SELECT x->>'name' FROM jsonb_array_elements(p_rows->'models') AS x
              EXCEPT SELECT unnest(p_touched_models)) AS d(t)
        UNION ALL
        SELECT 'node row', t
        FROM (SELECT x->>'id' FROM jsonb_array_elements(p_rows->'nodes') AS x
              EXCEPT SELECT unnest(p_touched_nodes)) AS d(t)
        UNION ALL
        SELECT 'replica row', t
        FROM (SELECT x->>'id' FROM jsonb_array_elements(p_rows->'replicas') AS x
              EXCEPT SELECT unnest(p_touched_replicas)) AS d(t)
        UNION ALL
        SELECT 'shard row', t
        FROM (SELECT x->>'replica_id' FROM jsonb_array_elements(p_rows->'shards') AS x
              EXCEPT SELECT unnest(p_touched_replicas)) AS d(t)
        UNION ALL
        SELECT 'key row', t
        FROM (SELECT x->>'id' FROM jsonb_array_elements(p_rows->'api_keys') AS x
              EXCEPT SELECT unnest(p_touched_keys)) AS d(t)
    ) s LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'no appended event is about the % %: its projection row is not written',
            v_stray.kind, coalesce(v_stray.name, 'without a name')
            USING ERRCODE = 'LG006';
    END IF;

    FOR i IN 1 .. coalesce(cardinality(p_stream), 0) LOOP
""".replace("@SLACK_S@", str(SLACK_S)),
    ),
)


def upgrade() -> None:
    op.execute(_function(changed=True))


def downgrade() -> None:
    op.execute(_function(changed=False))


def _function(*, changed: bool) -> str:
    """0016's ``llmgw_append``, with this revision's changes when ``changed``. ``CREATE OR
    REPLACE`` keeps the function, and so every grant on it."""
    previous = _revision("0016")
    chained = _revision("0005")
    definition: str = chained.APPEND_FUNCTION
    for old, new in previous.CHANGES + (CHANGES if changed else ()):
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
