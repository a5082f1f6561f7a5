"""The SQL of docs/rollouts.md answers what the page says it does, against a real log: two
rollouts of one model, decided by the reconciler's pure pass with agents that do what it
asks, are appended through the PostgreSQL store with the actors and correlation ids the
control plane records them with, and the page's queries list them, and one's steps and
verdicts, in order.

The page follows docs/audit.md's conventions: each query is a fenced ``sql`` block after a
``<!-- query: NAME -->`` line, its inputs psql variables (``:'name'``) set in the ``psql``
block after ``<!-- variables -->``, substituted here as psql does. The story uses the
page's own example values, so what the page shows is true of it."""

from __future__ import annotations

import itertools
from datetime import datetime
from pathlib import Path

import pytest
from msgspec.structs import replace

from app.domain import rollout_operations as rollouts
from app.domain.decision import Decision
from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    RolloutPaused,
    RolloutResumed,
    RolloutRolledBack,
    RolloutStarted,
)
from app.domain.model_operations import apply_model
from app.domain.model_spec import CanaryStep, RolloutPolicy
from app.domain.rollout_reads import canary_group, stable_group
from app.domain.state import RolloutState
from app.store.database import connection
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from tests.integration.test_audit_queries import QUERY_BLOCK, SET_LINE, VARIABLES_BLOCK, bind
from tests.support.generators import stream_for
from tests.unit.test_reconcile import EPOCH, Cluster
from tests.unit.test_rollouts import figures, step

pytestmark = pytest.mark.timeout(120)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "rollouts.md"
OPERATOR = "alice"


def page_queries() -> tuple[dict[str, str], dict[str, str]]:
    """The page's psql variables and its queries, by name."""
    text = PAGE.read_text()
    block = VARIABLES_BLOCK.search(text)
    assert block, f"{PAGE} has no <!-- variables --> psql block"
    variables = {}
    for line in filter(None, block["body"].splitlines()):
        set_line = SET_LINE.match(line)
        assert set_line, f"not a \\set line: {line!r}"
        variables[set_line["name"]] = set_line["value"]
    queries = {found["name"]: found["sql"] for found in QUERY_BLOCK.finditer(text)}
    assert len(queries) == text.count("```sql"), "every sql block is a named query"
    return variables, queries


class RecordingCluster(Cluster):
    """The unit stories' cluster, keeping every event with the actor and correlation id
    the control plane records it with: an operator's change with its request's id (a
    pause, resume or undo of a rollout under way with the rollout's), an agent's report
    as ``agent:<node>``, the reconciler's decisions as decided."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, AnyEvent, Meta]] = []
        self._requests = itertools.count(1)

    def given(
        self, *events: AnyEvent, epoch: int | None = EPOCH, at: datetime | None = None
    ) -> None:
        super().given(*events, epoch=epoch, at=at)
        # A declaration that starts a rollout is recorded with the start, under its id.
        starts = [e.rollout_id for e in events if isinstance(e, RolloutStarted)]
        request = f"req-{next(self._requests)}"
        for event in events:
            node = getattr(event, "node_id", None)
            if node is not None:
                meta = Meta(actor=f"agent:{node}")
            elif isinstance(event, RolloutPaused | RolloutResumed | RolloutRolledBack):
                meta = Meta(actor=OPERATOR, correlation_id=event.rollout_id)
            else:
                meta = Meta(actor=OPERATOR, correlation_id=starts[0] if starts else request)
            self.log.append((stream_for(event), event, meta))

    def reconcile(self, **overrides: float) -> Decision:
        decision = super().reconcile(**overrides)
        for planned in decision.events:
            meta = Meta(actor="reconciler", correlation_id=planned.correlation_id)
            self.log.append((planned.stream, planned.event, meta))
        return decision


def two_rollouts(model: str) -> RecordingCluster:
    """Four replicas of ``model``; revision 2 paused by a canary with too few requests,
    resumed by an operator and finished; revision 3, whose canary is slower, rolled back."""
    cluster = RecordingCluster()
    cluster.node("gpu-1")
    cluster.node("gpu-2")
    canary = (CanaryStep(replicas=1, traffic=0.1, hold_s=60.0),)
    cluster.model(model, replicas=4, rollout=RolloutPolicy(steps=canary))
    cluster.after(31)  # past the adoption grace
    cluster.reconcile()
    for replica_id in sorted(cluster.state.replicas):
        cluster.serve(replica_id)
    for flag, canary_figures in (
        ("--upgraded", figures(3)),
        ("--slower", figures(50, ttft_ms=400)),
    ):
        spec = cluster.state.models[model].spec
        cluster.given(
            *apply_model(cluster.state, replace(spec, command=f"{spec.command} {flag}")).events
        )
        cluster.traffic = {canary_group(model): canary_figures, stable_group(model): figures(450)}
        for _ in range(20):
            step(cluster)
            rollout = cluster.state.models[model].rollout
            assert rollout is not None
            if rollout.state is RolloutState.PAUSED:
                cluster.given(*rollouts.resume(cluster.state, model).events)
            if not rollout.under_way:
                break
        assert rollout is not None
        assert not rollout.under_way, f"rollout {rollout.id} should have ended"
    return cluster


async def test_the_pages_queries_list_a_models_rollouts_and_one_rollouts_steps_and_verdicts(
    pg_store: PostgresEventStore,
) -> None:
    variables, queries = page_queries()
    model, rollout_id = variables["model"], variables["rollout"]
    assert rollout_id == f"rollout-{model}-r2", "the page's rollout is the model's first"
    cluster = two_rollouts(model)
    for stream, event, meta in cluster.log:
        await pg_store.append(stream, None, [NewEvent(event)], meta)

    async with connection(pg_store.engine) as db:
        rollouts_rows = await db.fetch(bind(queries["rollouts-of-a-model"], variables))
        steps_rows = await db.fetch(bind(queries["rollout-steps"], variables))

    assert [tuple(row)[1:5] + tuple(row)[6:] for row in rollouts_rows] == [
        (OPERATOR, rollout_id, 1, 2, True, "every replica runs revision 2"),
        (OPERATOR, f"rollout-{model}-r3", 2, 3, False, ROLLED_BACK),
    ]
    assert all(row["finished_at"] > row["started_at"] for row in rollouts_rows)
    positions = [row["position"] for row in steps_rows]
    assert positions == sorted(positions)
    assert [tuple(row)[2:] for row in steps_rows] == [
        (OPERATOR, "rollout_started", None, None, None, None, None, None, None),
        ("reconciler", "rollout_step_started", 1, 1, 0.1, None, None, None, None),
        ("reconciler", "rollout_holding", 1, None, None, None, None, None, None),
        ("reconciler", "rollout_verdict", 1, None, None, "inconclusive", 3, 450, TOO_FEW),
        ("reconciler", "rollout_paused", None, None, None, None, None, None, PAUSED),
        (OPERATOR, "rollout_resumed", None, None, None, None, None, None, None),
        ("reconciler", "rollout_step_started", 2, 4, None, None, None, None, None),
        ("reconciler", "rollout_finished", None, None, None, None, None, None, FINISHED),
    ]


TOO_FEW = (
    "the gateways saw 3 request(s) to the new revision and 450 to the others, "
    "fewer than min_requests 20"
)
PAUSED = f"no verdict: {TOO_FEW}; resume to promote, undo to roll back"
FINISHED = "every replica runs revision 2"
ROLLED_BACK = (
    "rolled back to revision 2: step 1: TTFT p95 400.0 ms against 100.0 ms "
    "(at most 1.2x allowed); latency p95 2000.0 ms against 500.0 ms (at most 1.2x allowed)"
)
