"""A chain hash on every event; appends and epoch bumps run as the owner, for a runtime role

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 09:00:00

Each event gets ``previous_position`` (the position of the event appended just before it, 0
for the first) and ``chain_hash``: sha256 of the previous event's chain hash followed by
this event's canonical bytes (``llmgw_event_bytes``; docs/audit.md defines them byte by
byte, and ``app/store/chain.py`` computes the same bytes on the client side for ``llmgw-server
log verify``). Existing events are chained here, in position order from the genesis value
(32 zero bytes).

``llmgw_append`` keeps its signature (the store calls it unchanged) and now computes the
chain under the append lock, so two appends can never link to the same predecessor. It and
``llmgw_next_epoch`` run as their owner (SECURITY DEFINER, search_path pinned): the runtime
role that ``llmgw-server migrate --runtime-role`` sets up may execute them, and writes no
table of the log directly (``app/store/grants.py`` says exactly what it may do).
"""

from collections.abc import Sequence

from alembic import context, op
from sqlalchemy import text

from app.store.grants import grant_runtime_privileges

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GENESIS = "'\\x" + "00" * 32 + "'::bytea"

# A text field is its UTF-8 length as a signed 4-byte big-endian integer followed by its
# UTF-8 bytes; NULL is the length -1 and no bytes. Nothing depends on the session's
# settings: convert_to() fixes the encoding, jsonb's text form is canonical (keys sorted,
# one space after ':' and ','), and the time is integer microseconds since 1970-01-01 UTC.
CANONICAL_BYTES = (
    """
CREATE FUNCTION llmgw_chain_text(value text) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN value IS NULL THEN '\\xffffffff'::bytea
                ELSE int4send(octet_length(convert_to(value, 'UTF8')))
                     || convert_to(value, 'UTF8') END
$$""",
    """
CREATE FUNCTION llmgw_event_bytes(
    p_position bigint,
    p_previous_position bigint,
    p_stream text,
    p_version int,
    p_type text,
    p_schema_version smallint,
    p_event_id uuid,
    p_recorded_at timestamptz,
    p_data jsonb,
    p_meta jsonb,
    p_replica_id text,
    p_node_id text,
    p_model text,
    p_actor text,
    p_correlation_id text
) RETURNS bytea LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    -- In variables, so that llmgw_chain_text is inlined (an argument it would evaluate
    -- three times must be a plain value) and this costs microseconds, not a plan per call.
    v_data text := p_data::text;
    v_meta text := p_meta::text;
BEGIN
    RETURN '\\x01'::bytea
        || int8send(p_position) || int8send(p_previous_position)
        || llmgw_chain_text(p_stream) || int8send(p_version::bigint)
        || llmgw_chain_text(p_type) || int8send(p_schema_version::bigint)
        || uuid_send(p_event_id)
        || int8send((extract(epoch FROM p_recorded_at) * 1000000)::bigint)
        || llmgw_chain_text(v_data) || llmgw_chain_text(v_meta)
        || llmgw_chain_text(p_replica_id) || llmgw_chain_text(p_node_id)
        || llmgw_chain_text(p_model) || llmgw_chain_text(p_actor)
        || llmgw_chain_text(p_correlation_id);
END;
$$""",
)

# Only for chaining the events already stored, in one statement: a running sha256 over the
# canonical bytes in position order. Dropped again once they are chained.
BACKFILL = (
    "CREATE FUNCTION llmgw_chain_step(state bytea, bytes bytea) RETURNS bytea "
    "LANGUAGE sql IMMUTABLE STRICT AS $$ SELECT sha256(state || bytes) $$",
    f"CREATE AGGREGATE llmgw_chain(bytea) (SFUNC = llmgw_chain_step, STYPE = bytea, "
    f"INITCOND = '\\x{'00' * 32}')",
    "ALTER TABLE events ADD COLUMN previous_position bigint, ADD COLUMN chain_hash bytea",
    "ALTER TABLE events DISABLE TRIGGER events_no_update_delete",
    """
UPDATE events SET previous_position = chained.previous_position,
                  chain_hash = chained.chain_hash
FROM (SELECT linked.position, linked.previous_position,
             llmgw_chain(llmgw_event_bytes(
                 linked.position, linked.previous_position, linked.stream, linked.version,
                 linked.type, linked.schema_version, linked.event_id, linked.recorded_at,
                 linked.data, linked.meta, linked.replica_id, linked.node_id, linked.model,
                 linked.actor, linked.correlation_id)) OVER (ORDER BY linked.position)
                 AS chain_hash
      FROM (SELECT e.position, e.stream, e.version, e.type, e.schema_version, e.event_id,
                   e.recorded_at, e.data, e.meta, e.replica_id, e.node_id, e.model, e.actor,
                   e.correlation_id,
                   lag(e.position, 1, 0::bigint) OVER (ORDER BY e.position) AS previous_position
            FROM events e) linked) chained
WHERE events.position = chained.position""",
    "ALTER TABLE events ENABLE TRIGGER events_no_update_delete",
    "ALTER TABLE events ALTER COLUMN previous_position SET NOT NULL, "
    "ALTER COLUMN chain_hash SET NOT NULL, "
    "ADD CONSTRAINT events_previous_position_check CHECK (previous_position < position), "
    "ADD CONSTRAINT events_chain_hash_check CHECK (octet_length(chain_hash) = 32)",
    "DROP AGGREGATE llmgw_chain(bytea)",
    "DROP FUNCTION llmgw_chain_step(bytea, bytea)",
)

APPEND_SIGNATURE = (
    "llmgw_append(bigint, bigint, text[], int[], text[], smallint[], jsonb[], uuid[], text[], "
    "text[], text[], jsonb, timestamptz, text, text, text[], text[], text[], text[], jsonb, text)"
)

# As in 0002, with the chain: positions are taken from the identity's sequence here, under
# the append lock, so each event can be hashed with its own position and its predecessor's
# hash before the one INSERT. SECURITY DEFINER: the runtime role has no INSERT, UPDATE or
# DELETE on these tables; this function is the only way it writes them, and it runs with
# a fixed search_path so that nothing the caller puts on its own path is called instead.
APPEND_FUNCTION = """
CREATE OR REPLACE FUNCTION llmgw_append(
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
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    v_last bigint;
    v_head bytea;
    v_epoch bigint;
    v_conflict record;
    v_positions bigint[];
    v_previous bigint[];
    v_hashes bytea[];
BEGIN
    PERFORM pg_advisory_xact_lock(7812739744726515713);

    IF p_epoch IS NOT NULL THEN
        SELECT epoch INTO v_epoch FROM leadership WHERE id = 1;
        IF v_epoch > p_epoch THEN
            RAISE EXCEPTION 'leader epoch % was superseded by epoch %', p_epoch, v_epoch
                USING ERRCODE = 'LG003', DETAIL = v_epoch::text;
        END IF;
    END IF;

    SELECT position, chain_hash INTO v_last, v_head FROM events ORDER BY position DESC LIMIT 1;
    v_last := coalesce(v_last, 0);
    v_head := coalesce(v_head, {genesis});
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

    FOR i IN 1 .. coalesce(cardinality(p_stream), 0) LOOP
        v_positions[i] := nextval('events_position_seq');
        v_previous[i] := v_last;
        v_head := sha256(v_head || llmgw_event_bytes(
            v_positions[i], v_last, p_stream[i], p_version[i], p_type[i], p_schema[i],
            p_event_id[i], p_recorded_at, p_data[i], p_meta, p_replica_id[i], p_node_id[i],
            p_model[i], p_actor, p_correlation_id));
        v_hashes[i] := v_head;
        v_last := v_positions[i];
    END LOOP;

    RETURN QUERY
    INSERT INTO events (position, previous_position, chain_hash, stream, version, type,
                        schema_version, data, meta, event_id, recorded_at, replica_id,
                        node_id, model, actor, correlation_id)
    OVERRIDING SYSTEM VALUE
    SELECT t.position, t.previous_position, t.chain_hash, t.stream, t.version, t.type,
           t.schema, t.data, p_meta, t.event_id, p_recorded_at, t.replica_id, t.node_id,
           t.model, p_actor, p_correlation_id
    FROM unnest(v_positions, v_previous, v_hashes, p_stream, p_version, p_type, p_schema,
                p_data, p_event_id, p_replica_id, p_node_id, p_model)
         AS t(position, previous_position, chain_hash, stream, version, type, schema, data,
              event_id, replica_id, node_id, model)
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

    UPDATE projection_checkpoints SET position = v_last WHERE name = 'main';
    PERFORM pg_notify(p_channel, v_last::text);
END;
$$
"""

# Only ever one more than the last: with UPDATE on leadership the runtime role could also
# lower the epoch (letting a deposed leader append again) or set it out of reach.
NEXT_EPOCH_FUNCTION = """
CREATE FUNCTION llmgw_next_epoch(p_holder text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
    INSERT INTO leadership (id, epoch, holder, acquired_at) VALUES (1, 1, p_holder, now())
    ON CONFLICT (id) DO UPDATE SET epoch = leadership.epoch + 1, holder = EXCLUDED.holder,
        acquired_at = EXCLUDED.acquired_at
    RETURNING epoch
$$
"""


def upgrade() -> None:
    bind = op.get_bind()
    schema = bind.execute(text("SELECT quote_ident(current_schema())")).scalar_one()
    for statement in CANONICAL_BYTES + BACKFILL:
        op.execute(statement)
    op.execute(APPEND_FUNCTION.format(schema=schema, genesis=GENESIS))
    op.execute(NEXT_EPOCH_FUNCTION.format(schema=schema))
    # Functions are executable by PUBLIC unless revoked; these two must not be.
    op.execute(f"REVOKE ALL ON FUNCTION {APPEND_SIGNATURE} FROM PUBLIC")
    op.execute("REVOKE ALL ON FUNCTION llmgw_next_epoch(text) FROM PUBLIC")
    grant_runtime_privileges(bind, context.config.attributes.get("runtime_role"))


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS llmgw_next_epoch(text)")
    op.execute(f"DROP FUNCTION IF EXISTS {APPEND_SIGNATURE}")
    previous = context.script.get_revision("0002")
    assert previous is not None, "revision 0002 is where llmgw_append was first defined"
    op.execute(previous.module.APPEND_FUNCTION)
    op.execute(
        "DROP FUNCTION IF EXISTS llmgw_event_bytes(bigint, bigint, text, int, text, smallint, "
        "uuid, timestamptz, jsonb, jsonb, text, text, text, text, text)"
    )
    op.execute("DROP FUNCTION IF EXISTS llmgw_chain_text(text)")
    op.execute(
        "ALTER TABLE events DROP CONSTRAINT IF EXISTS events_chain_hash_check, "
        "DROP CONSTRAINT IF EXISTS events_previous_position_check, "
        "DROP COLUMN IF EXISTS chain_hash, DROP COLUMN IF EXISTS previous_position"
    )
