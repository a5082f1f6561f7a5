"""A node with more GPUs than a hello may list (``MAX_GPUS_PER_NODE``) would be refused at
every connection and reconnect for ever. The agent refuses to start on one instead, saying
why in one line; GPUs that appear past the limit while it runs are left out of its hellos,
saying which in the log."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agent import main
from agent.command_line import EXIT_USAGE
from agent.gpu_limit import GpusOverLimit, within_node_limit
from agent.gpus import GpuSource
from agent.runtime import AgentRuntime
from app.hub.claims import inventory_refusal
from app.pki.builders import build_ca, issue_node
from app.pki.files import write_ca, write_issued
from app.pki.keys import generate_key
from tests.unit.test_agent_vanished_gpus import ScriptedGpus, a_config, a_gpu, hello_of, listed
from wire.messages import MAX_GPUS_PER_NODE


def gpus(indexes: range) -> ScriptedGpus:
    return ScriptedGpus(*(a_gpu(index, f"GPU-{index}") for index in indexes))


async def test_an_agent_whose_gpu_source_lists_more_gpus_than_a_node_may_report_does_not_start(
    tmp_path: Path,
) -> None:
    runtime = AgentRuntime(a_config(tmp_path), gpus(range(100)))
    try:
        with pytest.raises(GpusOverLimit) as refused:
            await runtime.start()
    finally:
        await runtime.close()

    assert str(refused.value).startswith(
        f"the GPU source lists 100 GPUs; a node may report at most {MAX_GPUS_PER_NODE}"
    )


def with_node_certificate(tmp_path: Path) -> Path:
    """``tmp_path`` holding ``ca.crt``, ``node.crt`` and ``node.key`` for gpu-07."""
    now = datetime.now(UTC)
    ca = build_ca(generate_key(), "llmgw CA", now, 1)
    write_ca(tmp_path, ca, force=False)
    key = generate_key()
    write_issued(tmp_path, "node", issue_node(ca, key, "gpu-07", now, 1), key, force=False)
    return tmp_path


@pytest.mark.timeout(30)  # it takes well under a second; without the refusal it never ends
async def test_the_agent_refuses_to_start_with_one_line_naming_the_count_and_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As on a machine whose NVML lists 100 GPUs: exit 2, one line on stderr, no hello."""

    def nvml_of_100_gpus(*_: object, **__: object) -> GpuSource:
        return gpus(range(100))

    monkeypatch.setattr(main, "open_gpu_source", nvml_of_100_gpus)
    pki = with_node_certificate(tmp_path / "pki")
    config = replace(
        a_config(tmp_path), cert=pki / "node.crt", key=pki / "node.key", ca=pki / "ca.crt"
    )

    code = await main.run_agent(config)

    assert code == EXIT_USAGE
    assert capsys.readouterr().err == (
        "llmgw-agent: the GPU source lists 100 GPUs; a node may report at most 64 (the "
        "control plane refuses a hello with more), so this agent could never connect\n"
    )


async def test_gpus_that_appear_past_the_limit_are_left_out_of_the_hello_saying_which(
    tmp_path: Path,
) -> None:
    """NVML lists GPUs added while the agent runs: the node keeps serving on the GPUs the
    control plane knows, and its hello is one the control plane takes."""
    source = gpus(range(MAX_GPUS_PER_NODE))
    runtime = AgentRuntime(a_config(tmp_path), source)
    await runtime.start()
    try:
        source.gpus = gpus(range(MAX_GPUS_PER_NODE + 2)).gpus
        with capture_logs() as logs:
            await runtime.refresh_gpus()
            await runtime.refresh_gpus()
        hello = await hello_of(runtime)
    finally:
        await runtime.close()

    assert inventory_refusal(hello) is None
    assert [index for index, *_ in listed(hello)] == list(range(MAX_GPUS_PER_NODE))
    [warning] = [line for line in logs if line["event"] == "gpus_over_node_limit"]
    assert warning["log_level"] == "warning"
    assert (warning["listed"], warning["reported"]) == (66, 64)
    assert warning["left_out"] == ["64 GPU-64", "65 GPU-65"]


def test_the_gpus_kept_are_those_of_the_lowest_indexes_in_the_order_listed() -> None:
    listing = [a_gpu(index, f"GPU-{index}") for index in reversed(range(70))]

    kept, left_out = within_node_limit(listing)

    assert [gpu.index for gpu in kept] == list(reversed(range(64)))
    assert [gpu.index for gpu in left_out] == list(reversed(range(64, 70)))


def test_a_listing_within_the_limit_is_kept_whole() -> None:
    listing = [a_gpu(index, f"GPU-{index}") for index in range(MAX_GPUS_PER_NODE)]

    assert within_node_limit(listing) == (tuple(listing), ())
