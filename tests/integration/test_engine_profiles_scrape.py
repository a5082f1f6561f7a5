"""The gateway's scraper against a simulator speaking each engine profile's metric names
(``llmgw-sim-engine --profile``): queues filled by real requests show in the router under
vLLM's, SGLang's and llama.cpp's names alike, and an engine without a KV-cache gauge is
admitted by its waiting queue, which the scraper says once."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator

import aiohttp
import pytest
from structlog.testing import capture_logs

from agent.simulator.launcher import SimulatorProcess, start_simulator
from app.gateway.route_refusals import Saturated
from app.gateway.router import Router
from app.gateway.table import GatewaySnapshot, Route
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

MODEL = "sim-model"
ONE_SLOT = (
    "--max-num-seqs", "1", "--decode-base-ms", "50", "--decode-per-seq-ms", "0",
    "--prefill-ms-per-token", "0",
)  # fmt: skip


@pytest.fixture(params=["vllm", "sglang", "llamacpp"])
def profiled(request: pytest.FixtureRequest) -> Iterator[tuple[str, SimulatorProcess]]:
    profile: str = request.param
    with start_simulator(*ONE_SLOT, "--profile", profile) as sim:
        sim.wait_healthy()
        yield profile, sim


async def test_each_profiles_queue_reaches_admission(
    profiled: tuple[str, SimulatorProcess],
) -> None:
    profile, simulator = profiled
    requests: list[asyncio.Task[None]] = []
    async with aiohttp.ClientSession() as session:

        async def hold_a_slot() -> None:
            body = {"model": MODEL, "prompt": uuid.uuid4().hex, "max_tokens": 1000}
            async with session.post(f"{simulator.base_url}/v1/completions", json=body) as resp:
                await resp.read()

        router = Router(queue_timeout_s=0.2)
        route = Route(replica_id="r", model=MODEL, url=simulator.base_url, target_waiting=2)
        router.update(GatewaySnapshot(declared=frozenset({MODEL}), routes={MODEL: (route,)}))
        with capture_logs() as logs:
            await router.start(session)
            try:
                for _ in range(3):
                    requests.append(asyncio.create_task(hold_a_slot()))

                def sees_the_queue() -> bool:
                    view = router.replica_views()[0]
                    return (view.running, view.waiting) == (1, 2)

                await wait_until(sees_the_queue, what=f"{profile}: 1 running, 2 waiting")
                # Two waiting is the replica's target: admission turns the next request away.
                with pytest.raises(Saturated):
                    await router.acquire(MODEL, key_id="k")
            finally:
                for task in requests:
                    task.cancel()
                for task in requests:
                    with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                        await task
                await router.close()

    absent = [entry for entry in logs if entry["event"] == "engine_signals_absent"]
    if profile == "llamacpp":
        assert [(e["absent"], e["admission_by"]) for e in absent] == [
            (["kv_usage"], "waiting queue only")
        ]
        # No KV-cache gauge: none is published, rather than an empty cache.
        assert router.replica_views()[0].kv_usage is None
    else:
        assert absent == []
        assert router.replica_views()[0].kv_usage is not None
