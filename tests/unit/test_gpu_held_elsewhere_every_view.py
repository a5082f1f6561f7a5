"""A GPU whose UUID another node holds is said wherever a GPU's trouble is said: with every
other reason placement passes it over in the node's view, on the node view's state line
as a cordoned GPU is, and in the replica list, by node.

Before, a GPU both unhealthy and held elsewhere said only ``unhealthy: ...``, so an
operator who fixed its health found it still took nothing; `llmgw-cli node` named its
cordoned GPUs but not those held elsewhere; and the replica list looked the same for a
replica on such a GPU as for any other, only `llmgw-cli replica ID` said it."""

from __future__ import annotations

import msgspec
import pytest

from app.admin.nodes import node_view
from app.admin.replicas import replica_summary, replica_view
from app.domain.events import GpuCordoned, GpuInfo, ReplicaServing, ReplicaStopped
from app.domain.gpu_claims import gpus_held_elsewhere
from cli.nodes import print_node
from cli.replicas import replica_row
from cli.views import NodeView, ReplicaSummary
from tests.unit.test_gpu_claims import SHARED, connected, given, gpu, placed_on

HELD = f"held elsewhere: its UUID {SHARED} is listed by node gpu-2 too, connected longer"


def unhealthy(index: int, uuid: str, reason: str) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=uuid,
        name="H100",
        memory_total_mib=81559,
        healthy=False,
        unhealthy_reason=reason,
    )


def test_a_gpu_unhealthy_and_held_elsewhere_says_both_in_the_order_placement_checks() -> None:
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", unhealthy(0, SHARED, "XID 79: fell off the bus")),
    )

    [shown] = node_view(state, "gpu-1").gpus

    assert shown.excluded_because == f"{HELD}; unhealthy: XID 79: fell off the bus"


def test_every_reason_a_gpu_takes_no_shard_is_said_and_a_free_gpu_says_none() -> None:
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", unhealthy(0, SHARED, "ecc"), gpu(1, "GPU-1-own")),
        GpuCordoned(node_id="gpu-1", gpu_index=0, gpu_uuid=SHARED, reason="bad fan"),
        placed_on("gpu-1", 0),
    )

    [shared, own] = node_view(state, "gpu-1").gpus

    assert shared.excluded_because == (
        f"{HELD}; unhealthy: ecc; GPU 0 cordoned by alice: bad fan; used by replica llama-1"
    )
    assert own.excluded_because is None


def test_the_node_view_names_the_node_holding_each_gpu_held_elsewhere() -> None:
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", gpu(0, "GPU-1-own"), gpu(1, SHARED)),
    )

    gpus = msgspec.to_builtins(node_view(state, "gpu-1"))["gpus"]

    assert [g.get("held_elsewhere_by") for g in gpus] == [None, "gpu-2"]


def node_answer(**gpu_fields: object) -> NodeView:
    answer = {
        "id": "gpu-09",
        "connection": {"connected": True},
        "gpus": [
            {"index": 0, "uuid": "GPU-0", **gpu_fields},
            {"index": 1, "uuid": "GPU-1", "cordoned": True},
        ],
    }
    return msgspec.convert(answer, NodeView)


def state_line(capsys: pytest.CaptureFixture[str]) -> str:
    [line] = [line for line in capsys.readouterr().out.splitlines() if "state" in line]
    return " ".join(line.split())


def test_the_node_views_state_names_its_gpus_held_elsewhere_after_the_cordoned_ones(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")

    print_node(node_answer(held_elsewhere_by="gpu-07"))

    assert state_line(capsys) == "state: connected, GPU 1 cordoned, GPU 0 held elsewhere"


def test_a_node_view_from_a_server_that_does_not_say_looks_as_before(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")

    print_node(node_answer())

    assert state_line(capsys) == "state: connected, GPU 1 cordoned"


def test_the_replica_list_says_which_gpus_of_its_nodes_are_held_elsewhere() -> None:
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", gpu(0, SHARED), gpu(1, "GPU-1-own")),
        placed_on("gpu-1", 0),
        ReplicaServing(replica_id="llama-1"),
        placed_on("gpu-1", 1, "llama-2"),
    )
    elsewhere = gpus_held_elsewhere(state.nodes.values())

    on_shared = msgspec.to_builtins(replica_summary(state.replicas["llama-1"], {}, None, elsewhere))
    on_own = msgspec.to_builtins(replica_summary(state.replicas["llama-2"], {}, None, elsewhere))
    viewed = replica_view(state.replicas["llama-1"], {}, None, state.nodes)

    assert on_shared.get("held_elsewhere_gpus") == {"gpu-1": [0]}
    assert on_own.get("held_elsewhere_gpus") == {}
    assert viewed.held_elsewhere_gpus == {"gpu-1": [0]}


def test_an_ended_replica_is_not_flagged_for_a_gpu_it_no_longer_runs_on() -> None:
    state = given(
        connected("gpu-2", gpu(0, SHARED)),
        connected("gpu-1", gpu(0, SHARED)),
        placed_on("gpu-1", 0),
        ReplicaStopped(replica_id="llama-1"),
    )
    elsewhere = gpus_held_elsewhere(state.nodes.values())

    summary = msgspec.to_builtins(replica_summary(state.replicas["llama-1"], {}, None, elsewhere))

    assert summary.get("held_elsewhere_gpus") == {}


def test_the_replica_lists_row_marks_the_node_with_gpus_held_elsewhere() -> None:
    answer = {
        "id": "llama-1",
        "nodes": ["gpu-08", "gpu-09"],
        "held_elsewhere_gpus": {"gpu-09": [0, 2]},
    }

    row = replica_row(msgspec.convert(answer, ReplicaSummary))

    assert row[4] == "gpu-08,gpu-09 (GPUs 0,2 held elsewhere)"


def test_a_replica_from_a_server_that_does_not_say_lists_its_nodes_as_before() -> None:
    row = replica_row(ReplicaSummary(id="llama-1", nodes=["gpu-08", "gpu-09"]))

    assert row[4] == "gpu-08,gpu-09"
