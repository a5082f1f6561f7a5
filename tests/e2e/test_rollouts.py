"""Rollouts with real processes: a model of four replicas gets a new command while twenty
clients use it through a standalone gateway (the ``openai`` SDK, no retries).

- A harmless change rolls out replica by replica: no client sees an error, never fewer
  replicas serve than desired, every replica ends at the new revision, and the log tells
  the whole rollout in order: its start, then every step of it under its id.
- A revision whose engine exits at start is rolled back by the control plane on its own;
  the original replicas serve throughout, the very same ones.
- A canary step sends the new revision a quarter of the requests and holds: a revision
  whose engine is much slower is rolled back by the verdict on what the gateway measured;
  a healthy one is promoted and rolled out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

import pytest

from agent.simulator.launcher import simulator_command
from app.domain.decision import RECONCILER
from tests.support.cluster import (
    ADMIN_TOKEN_NAME,
    Cluster,
    JsonObject,
    LoggedEvent,
    about,
    first,
)
from tests.support.traffic import Traffic, serves
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.serial]  # the canary compares latencies

NODES = ("gpu-a", "gpu-b", "gpu-c")
"""Two fake GPUs each: four replicas and the moves' surge fit."""
MODEL = "sim"
REPLICAS = 4
CLIENTS = 20
PACED = (
    f"{simulator_command()} --port {{port}} --model {{model}} "
    "--decode-base-ms 20 --decode-per-seq-ms 0"
)
ENGINE = f"{PACED} --prefill-ms-per-token 0"
"""About 20 ms a token whatever the load: requests are in flight when routing changes, and
every replica of a revision answers alike, so a canary's figures compare fairly."""
HARMLESS_CHANGE = f"{ENGINE} --profile vllm"
"""A new command that runs the same engine (``vllm`` is the simulator's default profile)."""
EXITS_AT_START = f"{ENGINE} --start-delay 30 --exit-after 0.5"
"""An engine that exits with a failure half a second after it starts, never ready."""
SLOW_PREFILL = f"{PACED} --prefill-ms-per-token 20"
"""Every request admitted to a batch stalls it 20 ms a prompt token (a client's prompt has
five), so every step of a busy engine takes several times its 20 ms: a canary several
times slower than its peers by every measure, whose requests still end within a second or
two, so the hold sees enough of them."""
MOVES_WITHIN_S = 60.0
SAMPLE_EVERY_S = 0.1
MOVE_STEPS = (
    "replica_drain_started",
    "replica_placed",
    "replica_serving",
    "replacement_serving",
    "replica_stopping",
    "replica_stopped",
)
"""One move of a rollout, in the order the log must hold it: the original marked draining,
its replacement placed and serving, then the original handed over, stopping and stopped."""
ARRIVING = ("replica_placed", "replica_serving")
"""The steps of a move told on its replacement's stream; the others are its original's."""
HOLD_S = 4.0
MIN_REQUESTS = 10
LATENCY_RATIO = 2.0
CANARY_POLICY: JsonObject = {
    "steps": [{"replicas": 1, "traffic": 0.25, "hold_s": HOLD_S}],
    "min_requests": MIN_REQUESTS,
    "min_latency_samples": MIN_REQUESTS,
    "max_latency_ratio": LATENCY_RATIO,
}
"""One canary replica of four (a quarter of the requests either way), held 4 s: it has
served some 5 s by its verdict, a few dozen requests, so the p95s are judged on as few
samples as requests. The verdict compares p95s of requests the gateway saw, over its 60 s
window: a freshly started engine on a loaded machine of two cores wanders above its
peers' p95s, never twice as high."""
LATENCIES = ("ttft_p95_ms", "tpot_p95_ms", "latency_p95_ms")


async def test_a_rollout_under_traffic_replaces_every_replica_without_a_failed_request(
    cluster: Cluster,
) -> None:
    gateway_url, key = await four_replicas_behind_a_gateway(cluster, rollout={})
    originals = await serving_ids(cluster)

    async with Traffic(gateway_url, key, MODEL, clients=CLIENTS) as traffic:
        await traffic.wait_for_successes(2 * CLIENTS)
        async with sampled(cluster) as samples:
            rollout_id = await declare(cluster, HARMLESS_CHANGE, rollout={})
            finished = await finish_of(cluster, rollout_id)
            await wait_until(lambda: settled(cluster), what="the last original stopped")
        await traffic.wait_for_successes(2 * CLIENTS)
    traffic.assert_no_failures()
    assert finished.get("succeeded") is True, finished
    assert min(samples.serving_counts()) >= REPLICAS, samples.serving_counts()
    assert len(samples.taken) > 20, "the replicas were hardly sampled"

    serving = await cluster.replicas(model=MODEL, phase="serving")
    assert len(serving) == REPLICAS, serving
    assert {r["revision"] for r in serving} == {2}, serving
    assert not {str(r["id"]) for r in serving} & set(originals), serving
    assert await model_revision(cluster) == 2

    log = await cluster.events()
    assert_rollout_told_in_order(log, rollout_id, originals)


async def test_a_revision_whose_engine_exits_at_start_is_rolled_back_by_itself(
    cluster: Cluster,
) -> None:
    gateway_url, key = await four_replicas_behind_a_gateway(cluster, rollout={})
    originals = await serving_ids(cluster)

    async with Traffic(gateway_url, key, MODEL, clients=CLIENTS) as traffic:
        await traffic.wait_for_successes(2 * CLIENTS)
        async with sampled(cluster) as samples:
            rollout_id = await declare(cluster, EXITS_AT_START, rollout={"max_failures": 1})
            finished = await finish_of(cluster, rollout_id)
            await wait_until(lambda: settled(cluster), what="the last original stopped")
        await traffic.wait_for_successes(2 * CLIENTS)
    traffic.assert_no_failures()
    assert finished.get("succeeded") is False, finished
    for taken in samples.taken:
        routable = {str(r["id"]) for r in taken if r["routable"]}
        assert set(originals) <= routable, taken

    assert await serving_ids(cluster) == originals
    assert await model_revision(cluster) == 1
    log = await cluster.events(after=samples.began_after)
    rolled_back = first(log, "rollout_rolled_back", rollout_id=rollout_id)
    assert "failed to start" in str(rolled_back.get("reason")), rolled_back
    assert rolled_back.get("to_revision") == 1, rolled_back
    (failed,) = [e for e in log if e.type == "replica_failed"]
    doomed = first(log, "replica_placed", replica_id=failed.get("replica_id"))
    assert doomed.get("revision") == 2, doomed
    assert doomed.correlation_id == rollout_id, doomed
    assert not [e for e in log if e.type == "replica_serving"], "nothing new served"
    assert not [e for e in log if e.type == "replica_stopping" and e.get("replica_id") in originals]
    moved = str(doomed.get("replaces"))
    cancelled = first(log, "replica_drain_cancelled", replica_id=moved)
    assert (
        first(log, "replica_drain_started", replica_id=moved).position
        < doomed.position
        < failed.position
        < rolled_back.position
        < cancelled.position
        < finished.position
    )
    decided = [e for e in log if e.actor == RECONCILER and e.type.startswith("rollout_")]
    assert {e.correlation_id for e in decided} == {rollout_id}, decided


async def test_a_canary_slower_than_its_peers_is_rolled_back_and_a_healthy_one_promoted(
    cluster: Cluster,
) -> None:
    gateway_url, key = await four_replicas_behind_a_gateway(cluster, rollout=CANARY_POLICY)
    originals = await serving_ids(cluster)

    async with Traffic(gateway_url, key, MODEL, clients=CLIENTS) as traffic:
        await traffic.wait_for_successes(2 * CLIENTS)
        async with sampled(cluster) as samples:
            slow = await declare(cluster, SLOW_PREFILL, rollout=CANARY_POLICY)
            slow_finished = await finish_of(cluster, slow)
            healthy = await declare(cluster, HARMLESS_CHANGE, rollout=CANARY_POLICY)
            healthy_finished = await finish_of(cluster, healthy)
            await wait_until(lambda: settled(cluster), what="the last original stopped")
        await traffic.wait_for_successes(2 * CLIENTS)
    traffic.assert_no_failures()
    assert min(samples.serving_counts()) >= REPLICAS, samples.serving_counts()

    log = await cluster.events(after=samples.began_after)
    assert slow_finished.get("succeeded") is False, slow_finished
    judged = first(log, "rollout_verdict", rollout_id=slow)
    print(f"the slow canary's verdict: {judged.get('verdict')}: {judged.get('reason')}")
    assert judged.get("verdict") == "roll_back", judged
    canary, stable = figures(judged, "canary"), figures(judged, "stable")
    assert canary["requests"] >= MIN_REQUESTS, judged
    slower = [m for m in LATENCIES if canary[m] > LATENCY_RATIO * stable[m]]
    assert slower, judged
    assert f"(at most {LATENCY_RATIO:g}x allowed)" in str(judged.get("reason")), judged
    rolled_back = first(log, "rollout_rolled_back", rollout_id=slow)
    assert judged.position < rolled_back.position < slow_finished.position
    (slow_canary,) = [e for e in log if e.type == "replica_placed" and e.get("revision") == 2]
    assert slow_canary.correlation_id == slow, slow_canary
    held = first(log, "rollout_holding", rollout_id=slow)
    assert first(log, "replica_serving", replica_id=slow_canary.get("replica_id")).position < (
        held.position
    )

    assert healthy_finished.get("succeeded") is True, healthy_finished
    promoted = first(log, "rollout_verdict", rollout_id=healthy)
    print(f"the healthy canary's verdict: {promoted.get('verdict')}: {promoted.get('reason')}")
    assert promoted.get("verdict") == "promote", promoted
    assert figures(promoted, "canary")["requests"] >= MIN_REQUESTS, promoted
    steps = [e.get("step") for e in log if e.type == "rollout_step_started"]
    assert steps == [0, 0, 1], steps  # the slow one never got past its canary
    serving = await cluster.replicas(model=MODEL, phase="serving")
    assert {r["revision"] for r in serving} == {3}, serving
    assert len(serving) == REPLICAS, serving
    assert not {str(r["id"]) for r in serving} & set(originals), serving


# -- the story's parts ---------------------------------------------------------------------


async def four_replicas_behind_a_gateway(
    cluster: Cluster, *, rollout: JsonObject
) -> tuple[str, str]:
    """Three nodes, the model at four replicas of ``ENGINE``, a standalone gateway routing
    to them, and an API key: the gateway's URL and the key."""
    cluster.start_server()
    await cluster.wait_for_leader()
    for node in NODES:
        cluster.start_agent(node)
    gateway = await cluster.start_gateway()  # while the agents connect
    await cluster.wait_for_nodes_connected(NODES)
    await cluster.apply_simulated_model(MODEL, replicas=REPLICAS, command=ENGINE, rollout=rollout)
    key = await cluster.create_key("rollouts", [MODEL])
    await cluster.wait_for_serving(MODEL, REPLICAS)
    await wait_until(
        lambda: serves(gateway.url, key, MODEL), within_s=10.0, what="the gateway routes"
    )
    return gateway.url, key


async def declare(cluster: Cluster, command: str, *, rollout: JsonObject) -> str:
    """``PUT`` the model with ``command``; the id of the rollout it starts."""
    before = await cluster.last_position()
    await cluster.apply_simulated_model(MODEL, replicas=REPLICAS, command=command, rollout=rollout)
    started = await cluster.wait_for_event("rollout_started", after=before)
    return str(started.get("rollout_id"))


async def finish_of(cluster: Cluster, rollout_id: str) -> LoggedEvent:
    """The rollout's ``rollout_finished``, once logged; if it is not in time, a failure that
    tells the rollout's events so far (a verdict's or a pause's reason with them)."""
    try:
        return await cluster.wait_for_event(
            "rollout_finished", about(rollout_id=rollout_id), within_s=MOVES_WITHIN_S
        )
    except AssertionError as exc:
        told = [
            f"{e.type} {e.stream} {e.get('reason') or ''}".rstrip()
            for e in await cluster.events()
            if e.correlation_id == rollout_id
        ]
        raise AssertionError(f"{exc}; rollout {rollout_id} so far: {told}") from exc


async def settled(cluster: Cluster) -> bool:
    """``REPLICAS`` replicas serve and no other is on its way in or out."""
    phases = [str(r["phase"]) for r in await cluster.replicas(model=MODEL)]
    in_motion = {"placed", "starting", "draining", "stopping"}
    return phases.count("serving") == REPLICAS and not in_motion & set(phases)


async def serving_ids(cluster: Cluster) -> list[str]:
    return sorted(str(r["id"]) for r in await cluster.replicas(model=MODEL, phase="serving"))


async def model_revision(cluster: Cluster) -> int:
    shown = await cluster.admin("GET", f"/admin/v1/models/{MODEL}")
    assert isinstance(shown, dict), shown
    revision = shown["revision"]
    assert isinstance(revision, int), shown
    return revision


def figures(verdict: LoggedEvent, side: str) -> dict[str, float]:
    """One side's figures of a verdict: its request count and p95s (a p95 without samples
    reads 0)."""
    judged = verdict.get(side)
    assert isinstance(judged, dict), verdict
    return {name: float(judged.get(name) or 0) for name in ("requests", *LATENCIES)}


@dataclass
class Samples:
    """The model's replicas as the admin API shows them, read again and again."""

    began_after: int
    taken: list[list[JsonObject]] = field(default_factory=list)

    def serving_counts(self) -> list[int]:
        return [serving_count(replicas) for replicas in self.taken]


def serving_count(replicas: Iterable[JsonObject]) -> int:
    """Replicas in routing, a move's original and its serving replacement counted once."""
    routable = [r for r in replicas if r["routable"]]
    replaced = {r["replaces"] for r in routable if r["phase"] == "serving" and r["replaces"]}
    return sum(1 for r in routable if not (r["phase"] == "draining" and r["id"] in replaced))


@contextlib.asynccontextmanager
async def sampled(cluster: Cluster) -> AsyncIterator[Samples]:
    """Samples of the model's replicas taken while the block runs (and one at its end)."""
    samples = Samples(began_after=await cluster.last_position())

    async def sample() -> None:
        while True:
            samples.taken.append(await cluster.replicas(model=MODEL))
            await asyncio.sleep(SAMPLE_EVERY_S)  # a sampling period, not a wait

    sampler = asyncio.create_task(sample())
    try:
        yield samples
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    samples.taken.append(await cluster.replicas(model=MODEL))


def assert_rollout_told_in_order(
    log: Sequence[LoggedEvent], rollout_id: str, originals: Sequence[str]
) -> None:
    """The rollout's story: the operator's declaration with its start, then under the
    rollout's id everything the control plane did of it: its one step started, a move of
    every original (each told in ``MOVE_STEPS`` order), its end; nothing else."""
    started = first(log, "rollout_started", rollout_id=rollout_id)
    declared = first(log, "model_declared", revision=started.get("revision"))
    # One append, the operator's: the declaration and the start it makes carry the
    # rollout's id, as every step of it the control plane takes after them.
    assert declared.position + 1 == started.position, (declared, started)
    assert declared.actor == started.actor == ADMIN_TOKEN_NAME, started
    assert declared.correlation_id == started.correlation_id == rollout_id, (declared, started)
    told = [e for e in log if e.correlation_id == rollout_id]
    assert told[:2] == [declared, started], told
    assert {e.actor for e in told[2:]} == {RECONCILER}, told
    step = first(told, "rollout_step_started", rollout_id=rollout_id)
    finished = first(told, "rollout_finished", rollout_id=rollout_id)
    assert started.position < step.position < finished.position, told
    assert (step.get("step"), step.get("replicas")) == (0, REPLICAS), step
    for original in originals:
        placed = [e for e in log if e.type == "replica_placed" and e.get("replaces") == original]
        assert len(placed) == 1, (original, placed)
        replacement = str(placed[0].get("replica_id"))
        assert placed[0].get("revision") == 2, placed
        move = [
            first(log, kind, replica_id=replacement if kind in ARRIVING else original)
            for kind in MOVE_STEPS
        ]
        positions = [e.position for e in move]
        assert positions == sorted(positions), move
        assert step.position < positions[0], move
        assert move[-2].position < finished.position, move  # stopping; it may stop after
        assert all(e.correlation_id == rollout_id for e in move if e.type != "replica_serving"), (
            move
        )
    steps = told[2:]  # after the declaration and the start
    strays = [e for e in steps if e.type not in MOVE_STEPS and not e.type.startswith("rollout_")]
    assert not strays, strays
    kinds = {e.type for e in steps if e.type.startswith("rollout_")}
    assert kinds == {"rollout_step_started", "rollout_finished"}, told
