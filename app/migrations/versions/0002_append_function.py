"""llmgw_append(): one round trip for an append, its projection rows and its checkpoint

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 16:25:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Why a function: an append is a lock, three checks, an insert, the projection rows, the
# checkpoint and a NOTIFY. Sent as separate statements that is ten round trips; as one
# function call it is one, which keeps an append close to the cost of a bare INSERT.
#
# Why the advisory lock: positions come from an identity sequence and are handed out at
# insert time, not commit time. Without serializing appends, positions 7 and 8 could
# commit in the order 8, 7 and a reader tailing "position > 8" would never see 7.
#
# Why p_last_position: the caller computed the projection rows from its in-memory fold of
# the log up to that position. If another writer appended since, those rows could be
# wrong; the call is refused (LG001) and the caller catches up and tries again.
APPEND_FUNCTION = """
CREATE FUNCTION llmgw_append(
    p_last_position bigint,
    p_epoch bigint,
    p_stream text[],
    p_version int[],
    p_type text[],
    p_schema smallint[],
    p_data jsonb[],
    p_event_id uuid[],
    p_replica_id text[],
    p_node_id text[],
    p_model text[],
    p_meta jsonb,
    p_recorded_at timestamptz,
    p_actor text,
    p_correlation_id text,
    p_touched_models text[],
    p_touched_nodes text[],
    p_touched_replicas text[],
    p_touched_keys text[],
    p_rows jsonb,
    p_channel text
) RETURNS TABLE (out_position bigint, out_event_id uuid)
LANGUAGE plpgsql AS $$
DECLARE
    v_last bigint;
    v_epoch bigint;
    v_conflict record;
BEGIN
    PERFORM pg_advisory_xact_lock(7812739744726515713);

    IF p_epoch IS NOT NULL THEN
        SELECT epoch INTO v_epoch FROM leadership WHERE id = 1;
        IF v_epoch > p_epoch THEN
            RAISE EXCEPTION 'leader epoch % was superseded by epoch %', p_epoch, v_epoch
                USING ERRCODE = 'LG003', DETAIL = v_epoch::text;
        END IF;
    END IF;

    SELECT coalesce(max(position), 0) INTO v_last FROM events;
    IF v_last <> p_last_position THEN
        RAISE EXCEPTION 'the log is at position %, the caller at %', v_last, p_last_position
            USING ERRCODE = 'LG001';
    END IF;

    IF EXISTS (SELECT 1 FROM events WHERE event_id = ANY(p_event_id)) THEN
        RAISE EXCEPTION 'some events are already in the log' USING ERRCODE = 'LG004';
    END IF;

    SELECT s.stream, s.actual INTO v_conflict
    FROM (SELECT t.stream, min(t.version) AS first_version,
                 coalesce((SELECT max(e.version) FROM events e WHERE e.stream = t.stream), 0)
                     AS actual
          FROM unnest(p_stream, p_version) AS t(stream, version) GROUP BY t.stream) s
    WHERE s.actual <> s.first_version - 1
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'stream % is at version %', v_conflict.stream, v_conflict.actual
            USING ERRCODE = 'LG002', DETAIL = v_conflict.stream || ' ' || v_conflict.actual;
    END IF;

    RETURN QUERY
    INSERT INTO events (stream, version, type, schema_version, data, meta, event_id,
                        recorded_at, replica_id, node_id, model, actor, correlation_id)
    SELECT t.stream, t.version, t.type, t.schema, t.data, p_meta, t.event_id, p_recorded_at,
           t.replica_id, t.node_id, t.model, p_actor, p_correlation_id
    FROM unnest(p_stream, p_version, p_type, p_schema, p_data, p_event_id, p_replica_id,
                p_node_id, p_model)
         AS t(stream, version, type, schema, data, event_id, replica_id, node_id, model)
    RETURNING position, event_id;

    -- Projection rows of every touched entity are replaced: deleted, then inserted from
    -- the rows the caller folded (an entity that no longer exists has no row to insert).
    -- Tables no event touched are skipped: most appends touch one or two.
    IF cardinality(p_touched_models) > 0 THEN
        DELETE FROM models WHERE name = ANY(p_touched_models);
        INSERT INTO models
            SELECT * FROM jsonb_populate_recordset(NULL::models, p_rows->'models');
    END IF;
    IF cardinality(p_touched_nodes) > 0 THEN
        DELETE FROM nodes WHERE id = ANY(p_touched_nodes);
        INSERT INTO nodes SELECT * FROM jsonb_populate_recordset(NULL::nodes, p_rows->'nodes');
    END IF;
    IF cardinality(p_touched_replicas) > 0 THEN
        DELETE FROM replicas WHERE id = ANY(p_touched_replicas);
        INSERT INTO replicas
            SELECT * FROM jsonb_populate_recordset(NULL::replicas, p_rows->'replicas');
        INSERT INTO shards
            SELECT * FROM jsonb_populate_recordset(NULL::shards, p_rows->'shards');
    END IF;
    IF cardinality(p_touched_keys) > 0 THEN
        DELETE FROM api_keys WHERE id = ANY(p_touched_keys);
        INSERT INTO api_keys
            SELECT * FROM jsonb_populate_recordset(NULL::api_keys, p_rows->'api_keys');
    END IF;

    SELECT max(position) INTO v_last FROM events;
    UPDATE projection_checkpoints SET position = v_last WHERE name = 'main';
    PERFORM pg_notify(p_channel, v_last::text);
END;
$$
"""


def upgrade() -> None:
    op.execute(APPEND_FUNCTION)


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION IF EXISTS llmgw_append(bigint, bigint, text[], int[], text[], "
        "smallint[], jsonb[], uuid[], text[], text[], text[], jsonb, timestamptz, text, text, "
        "text[], text[], text[], text[], jsonb, text)"
    )
