"""Autoscaling with real processes: a model's replicas follow its clients.

- Clients ramp from 1 to 16 and back: the autoscaler adds replicas while the demand the
  gateway reports climbs, removes them (out of routing, idle, stopped) once it has stayed
  low for the down window, and no client sees an error on the way up or down.
- A model idle long enough has no replica; its next request is held by the gateway while
  a replica starts, and served by it.
- An engine slower to start than the cold-start timeout: the held request gets 503 with
  ``Retry-After``, and a client that comes back as told is served once the replica is up.

Each model is applied whole through the admin API (``Cluster.apply_model``) with its
``autoscale`` policy and windows of seconds, so that the story fits in a minute.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import openai
import pytest

from agent.simulator.launcher import simulator_command
from app.domain.model_spec import AutoscalePolicy, ModelSpec
from tests.support.cluster import Cluster, GatewayProcess, LoggedEvent, about, first
from tests.support.traffic import Traffic, knows_key, serves
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(150), pytest.mark.serial]  # asserts how soon things happen

NODES = ("gpu-a", "gpu-b")
"""Two fake GPUs each: room for four replicas of one GPU."""
PACED_ENGINE = (
    f"{simulator_command()} --port {{port}} --model {{model}} "
    "--decode-base-ms 20 --decode-per-seq-ms 0 --prefill-ms-per-token 0"
)
"""About 20 ms a token (8 a request): requests are in flight long enough to be counted."""
ENGINE = f"{simulator_command()} --port {{port}} --model {{model}}"
"""The simulator as it starts by default: a second or so before it serves."""
AUTOSCALER = "autoscaler"
RAMP = (1, 2, 4, 8, 16)
"""Clients at each step of the ramp up; the ramp down takes the same steps back."""
SUCCESSES_PER_CLIENT_AT_EACH_STEP = 3
SCALED_WITHIN_S = 30.0
BACK_TO_ONE_WITHIN_S = 45.0
"""The down window (10 s) from the last step above one client, plus the quiesce and stop
of each replica removed, with room for a loaded machine."""
COLD_START_TIMEOUT_S = 30.0


def autoscaled(name: str, policy: AutoscalePolicy, *, command: str, replicas: int) -> ModelSpec:
    return ModelSpec(name=name, command=command, replicas=replicas, autoscale=policy)


async def start_cluster(cluster: Cluster, *specs: ModelSpec) -> GatewayProcess:
    """A leader, an agent for each of ``NODES``, ``specs`` declared, and a gateway."""
    cluster.start_server()
    await cluster.wait_for_leader()
    for node in NODES:
        cluster.start_agent(node)
    await cluster.wait_for_nodes_connected(NODES)
    for spec in specs:
        assert await cluster.apply_model(spec)
    return await cluster.start_gateway()


async def desired(cluster: Cluster, model: str) -> int:
    view = await cluster.admin("GET", f"/admin/v1/models/{model}")
    assert isinstance(view, dict), view
    count = view["desired"]
    assert isinstance(count, int), view
    return count


async def active_replicas(cluster: Cluster, model: str) -> list[str]:
    """Replicas of ``model`` that have not ended (stopping ones included)."""
    ended = {"stopped", "failed", "timed_out", "lost"}
    return [str(r["id"]) for r in await cluster.replicas(model=model) if r["phase"] not in ended]


def scaled_by_autoscaler(log: Sequence[LoggedEvent], model: str) -> list[LoggedEvent]:
    scaled = [e for e in log if e.type == "model_scaled" and e.get("model") == model]
    assert all(e.actor == AUTOSCALER for e in scaled), scaled
    return scaled


def whole(event: LoggedEvent, key: str) -> int:
    value = event.get(key)
    assert isinstance(value, int), event
    return value


def assert_inputs_recorded(event: LoggedEvent) -> None:
    """The figures that decided: the demand, what one replica carries, the windows."""
    inputs = event.get("inputs")
    assert isinstance(inputs, dict), event
    assert isinstance(inputs["demand"], int | float), event
    assert inputs["per_replica"] == 4, event
    assert inputs["per_replica_from"] == "target 4", event
    assert isinstance(inputs["up_window_mean"], int | float), event
    assert isinstance(inputs["down_window_max"], int | float), event
    assert isinstance(inputs["samples"], int), event
    assert inputs["samples"] >= 1, event
    assert event.get("reason"), event


# -- 1 -> N -> 1 under a ramp of clients -------------------------------------------------


@dataclass(eq=False)
class Ramp:
    """Groups of traffic clients started and stopped one group at a time."""

    base_url: str
    api_key: str
    model: str
    groups: list[Traffic] = field(default_factory=list)
    ended: list[Traffic] = field(default_factory=list)

    @property
    def clients(self) -> int:
        return sum(group.clients for group in self.groups)

    def successes(self) -> int:
        return sum(group.successes() for group in (*self.groups, *self.ended))

    async def to(self, clients: int) -> None:
        """Add a group of clients to reach ``clients``, or stop the newest groups down to
        it; then hold there until each client has had a few more answers."""
        while self.clients > clients:
            group = self.groups.pop()
            await group.stop()
            self.ended.append(group)
        if self.clients < clients:
            group = Traffic(self.base_url, self.api_key, self.model, clients=clients - self.clients)
            group.start()
            self.groups.append(group)
        await self.hold(SUCCESSES_PER_CLIENT_AT_EACH_STEP * clients)

    async def hold(self, successes: int, *, within_s: float = 30.0) -> None:
        wanted = self.successes() + successes
        try:
            await wait_until(
                lambda: self.successes() >= wanted,
                within_s=within_s,
                every_s=0.05,
                what=f"{successes} more answers with {self.clients} clients",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; so far {self.summary()}") from exc

    async def stop(self) -> None:
        """Stop every group, each letting its clients finish the request they are in."""
        while self.groups:
            group = self.groups.pop()
            await group.stop()
            self.ended.append(group)

    def failures(self) -> list[str]:
        return [group.summary() for group in self.ended if group.failures()]

    def summary(self) -> str:
        return "; ".join(group.summary() for group in (*self.ended, *self.groups))


RAMPED = "ramped"
RAMP_POLICY = AutoscalePolicy(
    min_replicas=1,
    max_replicas=4,
    target=4.0,
    up_window_s=2.0,
    down_window_s=10.0,
    max_step=4,
    cold_start_timeout_s=COLD_START_TIMEOUT_S,
)


async def test_a_ramp_of_clients_scales_one_to_many_and_back_to_one_without_a_failed_request(
    cluster: Cluster,
) -> None:
    spec = autoscaled(RAMPED, RAMP_POLICY, command=PACED_ENGINE, replicas=1)
    gateway = await start_cluster(cluster, spec)
    (first_replica,) = await cluster.wait_for_serving(RAMPED, 1)
    key = await cluster.create_key("ramp", [RAMPED])
    await wait_until(lambda: serves(gateway.url, key, RAMPED), what="the gateway routes")
    started = await cluster.last_position()

    ramp = Ramp(gateway.url, key, RAMPED)
    try:
        for clients in RAMP:
            await ramp.to(clients)
        await wait_until(
            lambda: scaled_up_and_serving(cluster), within_s=SCALED_WITHIN_S, what="scaled up"
        )
        await ramp.hold(SUCCESSES_PER_CLIENT_AT_EACH_STEP * ramp.clients)
        await wait_until(
            lambda: scaled_up_and_serving(cluster), within_s=SCALED_WITHIN_S, what="scaled up"
        )
        for clients in reversed(RAMP[:-1]):
            await ramp.to(clients)
        await wait_until(
            lambda: back_to(cluster, RAMPED, [str(first_replica["id"])]),
            within_s=BACK_TO_ONE_WITHIN_S,
            what=f"{RAMPED} back to its first replica alone",
        )
        await ramp.hold(SUCCESSES_PER_CLIENT_AT_EACH_STEP)
    finally:
        await ramp.stop()
    assert not ramp.failures(), ramp.summary()
    log = await cluster.events(after=started)
    scaled = scaled_by_autoscaler(log, RAMPED)
    counts = " -> ".join(str(n) for n in [1, *(whole(e, "replicas") for e in scaled)])
    answered = sum(len(group.outcomes) for group in ramp.ended)
    print(f"\nclients 1 -> 16 -> 1: replicas {counts}; {answered} requests, none failed")

    ups = [e for e in scaled if whole(e, "replicas") > whole(e, "previous")]
    downs = [e for e in scaled if whole(e, "replicas") < whole(e, "previous")]
    assert ups, scaled
    assert downs, scaled
    # The autoscaler may still be adding a replica as the ramp turns down (its up window
    # still sees the sixteen clients); the peak is the highest count it asked for.
    peak = max(whole(e, "replicas") for e in ups)
    assert peak > 1, scaled
    assert downs[-1].get("replicas") == 1, scaled
    for event in scaled:
        assert_inputs_recorded(event)
    assert "over 2s needs" in str(ups[0].get("reason")), ups[0]
    assert "over 10s needs" in str(downs[-1].get("reason")), downs[-1]
    assert all(ups[-1].position < e.position for e in downs), scaled

    # Every replica the autoscaler removed left through the drain-to-idle path: out of
    # routing first, its engine stopped after, then recorded stopped.
    added = [e.data["replica_id"] for e in log if e.type == "replica_placed"]
    assert len(added) == sum(whole(e, "replicas") - whole(e, "previous") for e in ups), added
    for replica in added:
        stopping = first(log, "replica_stopping", replica_id=replica)
        assert str(stopping.get("reason")).startswith("scaled down to"), stopping
        engine_stopped = first(log, "shard_stopped", replica_id=replica)
        stopped = first(log, "replica_stopped", replica_id=replica)
        assert stopping.position < engine_stopped.position < stopped.position


async def scaled_up_and_serving(cluster: Cluster) -> bool:
    """More than one replica wanted, and as many serving."""
    wanted = await desired(cluster, RAMPED)
    return wanted > 1 and len(await cluster.replicas(model=RAMPED, phase="serving")) == wanted


async def back_to(cluster: Cluster, model: str, replicas: list[str]) -> bool:
    return await desired(cluster, model) == len(replicas) and (
        await active_replicas(cluster, model) == replicas
    )


# -- to zero and back --------------------------------------------------------------------


IDLE = "idle"
IDLE_TO_ZERO_S = 4.0
IDLE_POLICY = AutoscalePolicy(
    min_replicas=0,
    max_replicas=1,
    target=4.0,
    up_window_s=1.0,
    down_window_s=IDLE_TO_ZERO_S,
    idle_to_zero_s=IDLE_TO_ZERO_S,
    cold_start_timeout_s=COLD_START_TIMEOUT_S,
)


async def test_an_idle_model_scales_to_zero_and_its_next_request_is_held_until_a_replica_serves(
    cluster: Cluster,
) -> None:
    spec = autoscaled(IDLE, IDLE_POLICY, command=ENGINE, replicas=1)
    gateway = await start_cluster(cluster, spec)
    # Idle from its declaration on, the replica may be at zero again before the gateway is
    # up on a loaded machine: that it served is read from the log, not from the replicas.
    warm_id = await first_served(cluster, IDLE)
    key = await cluster.create_key("idle", [IDLE])
    # Not a completion: the gateway's traffic window would hold it for a minute, and a
    # model with a request in the last minute is not idle (docs/autoscaling.md).
    await wait_until(lambda: knows_key(gateway.url, key), what="the gateway knows the key")

    # Idle from its declaration on: at zero once the idle spell has passed, wherever it
    # began.
    await wait_until(
        lambda: at_zero(cluster, IDLE), within_s=IDLE_TO_ZERO_S + 20, what=f"{IDLE} at zero"
    )
    log = await cluster.events("model_scaled", "replica_stopped")
    to_zero = [e for e in log if e.type == "model_scaled" and e.get("model") == IDLE][-1]
    assert to_zero.get("replicas") == 0, to_zero
    assert to_zero.actor == AUTOSCALER, to_zero
    assert to_zero.get("reason") == f"no demand for {IDLE_TO_ZERO_S:g}s", to_zero
    assert_inputs_recorded(to_zero)
    first(log, "replica_stopped", replica_id=warm_id)
    after_zero = await cluster.last_position()

    async with openai.AsyncOpenAI(base_url=gateway.url, api_key=key, max_retries=0) as sdk:
        listed = [m.id for m in (await sdk.models.list()).data]
        assert IDLE in listed, listed
        sent = time.monotonic()
        answer = await sdk.chat.completions.create(
            model=IDLE,
            messages=[{"role": "user", "content": "are you there?"}],
            max_tokens=4,
            timeout=COLD_START_TIMEOUT_S + 10,
        )
        latency_s = time.monotonic() - sent
    assert answer.choices[0].message.content, answer
    print(f"\nfirst request after scale to zero served in {latency_s:.2f}s (held for a cold start)")
    assert latency_s < COLD_START_TIMEOUT_S

    log = await cluster.events(after=after_zero)
    woken = first(log, "model_scaled", model=IDLE, replicas=1)
    assert woken.actor == AUTOSCALER, woken
    assert str(woken.get("reason")).startswith("demand "), woken
    assert str(woken.get("reason")).endswith("for a model with no replica"), woken
    assert_inputs_recorded(woken)
    placed = first(log, "replica_placed", model=IDLE)
    serving = first(log, "replica_serving", replica_id=placed.get("replica_id"))
    assert woken.position < placed.position < serving.position


async def first_served(cluster: Cluster, model: str) -> str:
    """The id of the first replica of ``model`` the log says served, once one has."""
    served: list[str] = []

    async def one_served() -> bool:
        log = await cluster.events("replica_placed", "replica_serving")
        of_model = {
            e.get("replica_id")
            for e in log
            if e.type == "replica_placed" and e.get("model") == model
        }
        served[:] = [
            str(e.get("replica_id"))
            for e in log
            if e.type == "replica_serving" and e.get("replica_id") in of_model
        ]
        return bool(served)

    await wait_until(one_served, within_s=20.0, every_s=0.1, what=f"a {model} replica served")
    return served[0]


async def at_zero(cluster: Cluster, model: str) -> bool:
    return await desired(cluster, model) == 0 and await active_replicas(cluster, model) == []


# -- a cold start slower than its timeout ------------------------------------------------


SLOW = "slow"
SLOW_COLD_START_S = 2.0
START_DELAY_S = 8.0
SLOW_POLICY = AutoscalePolicy(
    min_replicas=0,
    max_replicas=1,
    target=4.0,
    up_window_s=1.0,
    cold_start_timeout_s=SLOW_COLD_START_S,
)


async def test_a_cold_start_slower_than_its_timeout_answers_503_with_retry_after(
    cluster: Cluster,
) -> None:
    spec = ModelSpec(
        name=SLOW,
        command=(
            f"{simulator_command()} --port {{port}} --model {{model}} "
            f"--start-delay {START_DELAY_S:g}"
        ),
        replicas=0,
        autoscale=SLOW_POLICY,
    )
    gateway = await start_cluster(cluster, spec)
    key = await cluster.create_key("slow", [SLOW])
    # Not a completion: that would be the first request, held, whose end this test times.
    await wait_until(lambda: knows_key(gateway.url, key), what="the gateway knows the key")
    assert await active_replicas(cluster, SLOW) == []

    async with openai.AsyncOpenAI(base_url=gateway.url, api_key=key, max_retries=0) as sdk:

        async def ask() -> None:
            await sdk.chat.completions.create(
                model=SLOW, messages=[{"role": "user", "content": "hello"}], max_tokens=4
            )

        sent = time.monotonic()
        with pytest.raises(openai.APIStatusError) as refused:
            await ask()
        waited_s = time.monotonic() - sent
        error = refused.value
        assert error.status_code == 503, error
        assert error.code == "cold_start_timeout", error.body
        retry_after = error.response.headers.get("retry-after")
        assert retry_after is not None, error.response.headers
        assert int(retry_after) >= 1, error.response.headers
        assert SLOW_COLD_START_S <= waited_s < SLOW_COLD_START_S + 5, waited_s
        print(f"\nheld {waited_s:.2f}s, then 503 cold_start_timeout, Retry-After: {retry_after}")

        # The held request was demand: a replica is on its way, and a client that comes
        # back as told is served once it serves.
        woken = await cluster.wait_for_event("model_scaled", about(model=SLOW, replicas=1))
        assert woken.actor == AUTOSCALER, woken
        tries = 1
        served_after_s: float | None = None
        while served_after_s is None:
            # A client that honours Retry-After: it comes back when told, not sooner.
            await asyncio.sleep(int(retry_after))
            tries += 1
            assert tries <= 10, "never served"
            status, retry_after = await attempt(ask)
            assert status in (200, 503), status
            if status == 200:
                served_after_s = time.monotonic() - sent
    print(f"served {served_after_s:.2f}s after the first request, on try {tries}")
    assert served_after_s >= START_DELAY_S


async def attempt(ask: Callable[[], Awaitable[None]]) -> tuple[int, str]:
    """``ask`` once: 200, or the error's status, with its ``Retry-After`` ("1" without)."""
    try:
        await ask()
    except openai.APIStatusError as error:
        return error.status_code, error.response.headers.get("retry-after") or "1"
    return 200, "1"
