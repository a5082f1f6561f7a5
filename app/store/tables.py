"""Table definitions: the event log and the projections folded from it.

Alembic revisions are written against this metadata; the schema is created by
migrations only (``llmgw-server migrate``), never by ``create_all``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

metadata = MetaData()

events = Table(
    "events",
    metadata,
    Column("position", BigInteger, Identity(always=True), primary_key=True),
    Column("stream", Text, nullable=False),
    Column("version", Integer, nullable=False),
    Column("type", Text, nullable=False),
    Column("schema_version", SmallInteger, nullable=False),
    Column("data", JSONB, nullable=False),
    Column("meta", JSONB, nullable=False),
    Column("event_id", UUID(as_uuid=True), nullable=False, unique=True),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    # The keys auditors filter on, copied out of data/meta so plain SQL can index them.
    Column("replica_id", Text),
    Column("node_id", Text),
    Column("model", Text),
    Column("actor", Text, nullable=False),
    Column("correlation_id", Text),
    UniqueConstraint("stream", "version", name="events_stream_version_key"),
    Index("events_replica_id_idx", "replica_id", "position"),
    Index("events_node_id_idx", "node_id", "position"),
    Index("events_model_idx", "model", "position"),
    Index("events_actor_idx", "actor", "position"),
    Index("events_correlation_id_idx", "correlation_id", "position"),
    Index("events_type_idx", "type", "position"),
    Index("events_recorded_at_idx", "recorded_at"),
)

projection_checkpoints = Table(
    "projection_checkpoints",
    metadata,
    Column("name", Text, primary_key=True),
    Column("position", BigInteger, nullable=False),
)

leadership = Table(
    "leadership",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("epoch", BigInteger, nullable=False),
    Column("holder", Text, nullable=False),
    Column("acquired_at", DateTime(timezone=True), nullable=False),
)

models = Table(
    "models",
    metadata,
    Column("name", Text, primary_key=True),
    Column("engine", Text, nullable=False),
    Column("command", Text, nullable=False),
    Column("gpus_per_shard", Integer, nullable=False),
    Column("gpu_memory_gib", Float, nullable=False),
    Column("shards_per_replica", Integer, nullable=False),
    Column("desired_replicas", Integer, nullable=False),
    Column("removed", Boolean, nullable=False),
    Column("weight", Float, nullable=False),
    Column("target_waiting", Integer, nullable=False),
    Column("kv_ceiling", Float, nullable=False),
    Column("spec", JSONB, nullable=False),
    Column("replicas_created", Integer, nullable=False),
    Column("unplaceable_reason", Text),
    Column("tuned_summary", JSONB),
    Column("declared_at", DateTime(timezone=True), nullable=False),
    Column("failures", Integer, nullable=False, server_default="0"),
    Column("backoff_until", DateTime(timezone=True)),
    Column("revision", Integer, nullable=False, server_default="1"),
    Column("canary_revision", Integer),
    Column("canary_traffic", Float),
)

nodes = Table(
    "nodes",
    metadata,
    Column("id", Text, primary_key=True),
    Column("address", Text, nullable=False),
    Column("remote_address", Text, nullable=False),
    Column("labels", JSONB, nullable=False),
    Column("gpus", JSONB, nullable=False),
    Column("gpu_count", Integer, nullable=False),
    Column("healthy_gpu_count", Integer, nullable=False),
    Column("agent_version", Text, nullable=False),
    Column("port_lo", Integer, nullable=False),
    Column("port_hi", Integer, nullable=False),
    Column("connected", Boolean, nullable=False),
    Column("lost", Boolean, nullable=False),
    Column("cordoned", Boolean, nullable=False),
    Column("cordon_reason", Text),
    Column("drain_id", Text),
    Column("drain_grace_s", Float),
    Column("drain_requested_at", DateTime(timezone=True)),
    Column("registered_at", DateTime(timezone=True), nullable=False),
    Column("last_change_at", DateTime(timezone=True)),
)

replicas = Table(
    "replicas",
    metadata,
    Column("id", Text, primary_key=True),
    Column("model", Text, nullable=False, index=True),
    Column("number", Integer, nullable=False),
    Column("phase", Text, nullable=False, index=True),
    Column("routable", Boolean, nullable=False),
    Column("placed_at", DateTime(timezone=True), nullable=False),
    Column("reason", Text, nullable=False),
    Column("replaces", Text),
    Column("starting_since", DateTime(timezone=True)),
    Column("serving_since", DateTime(timezone=True)),
    Column("drain_id", Text),
    Column("drain_started_at", DateTime(timezone=True)),
    Column("replacement_id", Text),
    Column("ended_at", DateTime(timezone=True)),
    Column("end_reason", Text),
    Column("weight", Float),
    Column("target_waiting", Integer),
    Column("kv_ceiling", Float),
    Column("revision", Integer, nullable=False, server_default="1"),
    # The routes are the routable replicas, a few among every replica that ever ran (0018).
    Index("ix_replicas_routable", "model", "id", postgresql_where=text("routable")),
    # The replica list's order, byte by byte, so that a page of it costs a page (0019).
    Index(
        "ix_replicas_listing",
        text('model COLLATE "C"'),
        "number",
        text('id COLLATE "C"'),
    ),
)

shards = Table(
    "shards",
    metadata,
    Column(
        "replica_id",
        Text,
        ForeignKey("replicas.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("shard_index", Integer, primary_key=True),
    Column("node_id", Text, nullable=False, index=True),
    Column("gpus", JSONB, nullable=False),
    Column("port", Integer, nullable=False),
    Column("phase", Text, nullable=False),
    Column("pid", Integer),
    Column("came_up", Boolean, nullable=False),
    Column("error", Text),
    Column("exit_code", Integer),
    Column("log_tail", JSONB, nullable=False),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", Text, primary_key=True),
    Column("name", Text, nullable=False),
    Column("prefix", Text, nullable=False, unique=True),
    Column("secret_hash", Text, nullable=False),
    Column("models", JSONB, nullable=False),
    Column("rpm", Integer),
    Column("tpm", Integer),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("created_by", Text, nullable=False),
    Column("revoked_at", DateTime(timezone=True)),
    Column("revoked_by", Text),
    Column("expires_at", DateTime(timezone=True)),
)

gateway_reports = Table(
    "gateway_reports",
    metadata,
    # Not projected from the log: live telemetry each gateway overwrites (see
    # app/store/gateway_reports.py).
    Column("gateway_id", Text, primary_key=True),
    Column("in_flight", JSONB, nullable=False),
    Column("reported_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("traffic", JSONB),
    Column("queued", JSONB),
    Column("ejected", JSONB),
    Column("routing_position", BigInteger),
    Column("instance", Text),
)

rate_budgets = Table(
    "rate_budgets",
    metadata,
    # Not projected from the log: what gateways leased of each key's per-minute limits,
    # per second of the database's clock (app/store/rate_budgets.py).
    Column("key_id", Text, primary_key=True),
    Column("resource", Text, primary_key=True),
    Column("second", BigInteger, primary_key=True, autoincrement=False),
    Column("granted", BigInteger, nullable=False),
)

fold_snapshots = Table(
    "fold_snapshots",
    metadata,
    # Not projected from the log: the fold at a position, to start from instead of the
    # first event (app/store/snapshot_table.py). Written whole, never changed.
    Column("position", BigInteger, primary_key=True, autoincrement=False),
    Column("chain_hash", LargeBinary, nullable=False),
    Column("fingerprint", Text, nullable=False),
    Column("chunks", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("digest", LargeBinary, nullable=False),
    Column("written_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

fold_snapshot_chunks = Table(
    "fold_snapshot_chunks",
    metadata,
    Column("position", BigInteger, primary_key=True, autoincrement=False),
    Column("chunk", Integer, primary_key=True, autoincrement=False),
    Column("data", LargeBinary, nullable=False),
)

PROJECTION_TABLES = (models, nodes, replicas, shards, api_keys)
"""Every table the projector owns, in an order that respects foreign keys on insert."""
