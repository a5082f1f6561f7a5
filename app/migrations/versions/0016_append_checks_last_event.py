"""llmgw_append checks the event the caller's fold ends with, not only its position

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 01:30:00

``llmgw_append`` refused an append when the log's last position was not the one the
caller's fold was built at (``LG001``). After a failover to an asynchronous standby that had
not received the last events, other writers can take the log to that same position again
with other events: a writer whose fold still holds the lost ones passed the check and
appended decisions made on a history the log no longer holds. The function now also takes
``p_last_event_id``, the id of the event the fold ends with (NULL for an empty fold), and
refuses with ``LG001`` as well when the log's last event is another one (or none, or the
log has one and the caller names none). The store then catches up, finds the fold's event
gone and builds the fold again (``app/store/folded.py``). The check reads nothing more: the
last event's id comes with the position and chain hash the function reads already.

The function is 0005's with those changes made to its text (each must apply exactly once),
so the two cannot drift apart. A new parameter is a new function to PostgreSQL: the old
signature is dropped, so no caller can skip the check, and with it every grant on it; the
runtime roles that held it are found first and given their privileges again, as 0005 did.

Roll the control planes right after migrating (docs/operations.md, Upgrades): one of an
older release finds no ``llmgw_append`` it can call, and its appends fail, writing nothing,
until it is replaced; a server of this release on a database not yet migrated fails the
same way. Gateways do not append. Downgrading restores 0005's function.
"""

from collections.abc import Sequence
from types import ModuleType

from alembic import context, op
from sqlalchemy import Connection, text

from app.store.grants import grant_runtime_privileges, runtime_roles

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (0005's text, this revision's): the parameter, the variable, reading it with the position,
# and the check after the position's.
CHANGES = (
    (
        "    p_last_position bigint,\n",
        "    p_last_position bigint,\n    p_last_event_id uuid,\n",
    ),
    (
        "    v_head bytea;\n",
        "    v_head bytea;\n    v_last_event_id uuid;\n",
    ),
    (
        "SELECT position, chain_hash INTO v_last, v_head FROM events",
        "SELECT position, chain_hash, event_id INTO v_last, v_head, v_last_event_id FROM events",
    ),
    (
        """            USING ERRCODE = 'LG001';
    END IF;
""",
        """            USING ERRCODE = 'LG001';
    END IF;
    -- The same position with another event: the log lost the caller's last events (a
    -- failover to a standby that had not received them) and went on with others.
    IF v_last_event_id IS DISTINCT FROM p_last_event_id THEN
        RAISE EXCEPTION 'the event at position % is %, the caller''s is %',
            v_last, coalesce(v_last_event_id::text, 'none'),
            coalesce(p_last_event_id::text, 'none')
            USING ERRCODE = 'LG001';
    END IF;
""",
    ),
)


def upgrade() -> None:
    bind = op.get_bind()
    chained = _revision_0005()
    held = runtime_roles(bind)
    op.execute(f"DROP FUNCTION {chained.APPEND_SIGNATURE}")
    op.execute(_function(bind, chained, changed=True))
    op.execute(f"REVOKE ALL ON FUNCTION {append_signature(chained)} FROM PUBLIC")
    _grant_again(bind, held)


def downgrade() -> None:
    bind = op.get_bind()
    chained = _revision_0005()
    held = runtime_roles(bind)
    op.execute(f"DROP FUNCTION IF EXISTS {append_signature(chained)}")
    op.execute(_function(bind, chained, changed=False))
    op.execute(f"REVOKE ALL ON FUNCTION {chained.APPEND_SIGNATURE} FROM PUBLIC")
    _grant_again(bind, held)


def append_signature(chained: ModuleType) -> str:
    signature: str = chained.APPEND_SIGNATURE
    return _replaced_once(signature, "llmgw_append(bigint, ", "llmgw_append(bigint, uuid, ")


def _function(bind: Connection, chained: ModuleType, *, changed: bool) -> str:
    definition: str = chained.APPEND_FUNCTION
    if changed:
        for old, new in CHANGES:
            definition = _replaced_once(definition, old, new)
    schema = bind.execute(text("SELECT quote_ident(current_schema())")).scalar_one()
    return definition.format(schema=schema, genesis=chained.GENESIS)


def _grant_again(bind: Connection, held: list[str]) -> None:
    """Dropping the function dropped the grants on it: the roles that held them, and the
    one this migration was asked for, get the runtime privileges again."""
    for role in held:
        grant_runtime_privileges(bind, role)
    grant_runtime_privileges(bind, context.config.attributes.get("runtime_role"))


def _revision_0005() -> ModuleType:
    script = context.script.get_revision("0005")
    assert script is not None, "revision 0005 is where llmgw_append got its chain"
    return script.module


def _replaced_once(source: str, old: str, new: str) -> str:
    if source.count(old) != 1:
        raise RuntimeError(f"expected {old!r} exactly once in 0005's llmgw_append")
    return source.replace(old, new)
