"""What migration 0017's guards cost an append, for ``benchmarks/eventstore.py --guards``.

0017 made ``llmgw_append`` refuse a time far from the database's clock (``LG005``) and
projection rows of entities no appended event is about (``LG006``). Both run inside the
function, so the cost is measured there: the same store, the same Python and the same
log, appending through the installed function ("now") and through a copy of it without
0017's checks ("before": up to 0019, 0016's text, the function of commit 91c3e63; from
0020 on, with the later revisions' changes in both), in alternating rounds. The copy lives
in a schema of its own and is built from the installed text by undoing 0017's own
``CHANGES`` (each must apply exactly once, so the copy cannot drift from what 0017 added);
a store whose connections put that schema first calls it.

Both stores connect as the benchmark's runtime role, as a control plane does: the time
bound is skipped for the function's owner and its members, so an owner would not pay it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import asyncpg
import msgspec

from benchmarks.common import BENCH_RUNTIME_ROLE

UNGUARDED_SCHEMA = "bench_unguarded"
BATCHES = (1, 5, 100, 1_000, 5_000)
"""Events per call: a single append, the control plane's usual append (a few events on a
few streams, with their projection rows), the event-store benchmark's batch, and two
large batches (a bulk import, or a fleet reconnecting at once)."""
_MIGRATION = (
    Path(__file__).resolve().parents[1]
    / "app/migrations/versions/0017_append_guards_time_and_rows.py"
)


class GuardCost(msgspec.Struct, frozen=True, kw_only=True):
    """One batch size: appends with 0017's guards against the same without them."""

    events_per_call: int
    calls_per_round: int
    guarded_rounds: list[float]
    """Events per second in each round, with the guards."""
    unguarded_rounds: list[float]
    guarded_median: float
    unguarded_median: float
    ratio: float
    """Median guarded rate over median unguarded rate."""
    round_ratios: list[float]
    guarded_p50_ms: float
    unguarded_p50_ms: float
    guarded_p99_ms: float
    unguarded_p99_ms: float
    guarded_server_ms: float | None
    """Time per call inside ``llmgw_append`` (``track_functions``); None where the
    benchmark may not turn that on."""
    unguarded_server_ms: float | None


async def install_unguarded_append(
    db: asyncpg.Connection, grantee: str = BENCH_RUNTIME_ROLE.name
) -> None:
    """``bench_unguarded.llmgw_append``: the installed function without 0017's checks,
    which ``grantee`` (a role name) may call."""
    definition: str = await db.fetchval("SELECT pg_get_functiondef('llmgw_append'::regproc)")
    for before, after in _migration_0017().CHANGES:
        if definition.count(after) != 1:
            raise RuntimeError("llmgw_append no longer holds 0017's changes exactly once")
        definition = definition.replace(after, before)
    marker = "FUNCTION public.llmgw_append("
    if definition.count(marker) != 1:
        raise RuntimeError("llmgw_append is no longer defined in the public schema")
    definition = definition.replace(marker, f"FUNCTION {UNGUARDED_SCHEMA}.llmgw_append(")
    await db.execute(f"CREATE SCHEMA IF NOT EXISTS {UNGUARDED_SCHEMA}")
    await db.execute(f"GRANT USAGE ON SCHEMA {UNGUARDED_SCHEMA} TO {grantee}")
    await db.execute(definition)


def _migration_0017() -> ModuleType:
    """The migration's module, read from its file: its ``CHANGES`` are (0016's text, 0017's)."""
    spec = importlib.util.spec_from_file_location("migration_0017", _MIGRATION)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {_MIGRATION}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
