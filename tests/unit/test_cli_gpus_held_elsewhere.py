"""`llmgw-cli nodes` and `llmgw-cli replica ID` show a GPU whose UUID another node holds,
as the API says it: in the fleet summary, after the node's state, as a cordoned GPU is;
in a replica's facts, for each GPU of its shards. Before, such a node looked healthy in the
list, and a replica on such a GPU said nothing of it."""

from __future__ import annotations

import msgspec
import pytest

from cli.nodes import node_row
from cli.replicas import print_replica
from cli.views import NodeSummary, ReplicaView

SHARED = "GPU-84bba079-31db-9253-06a0-799dc6ebd718"


def test_the_fleet_summary_says_which_gpus_of_a_node_are_held_elsewhere() -> None:
    answer = {
        "id": "gpu-09",
        "connected": True,
        "gpus": 4,
        "healthy_gpus": 4,
        "free_gpus": 1,
        "cordoned_gpus": [3],
        "held_elsewhere_gpus": [0, 1],
    }

    row = node_row(msgspec.convert(answer, NodeSummary))

    assert row[1] == "connected, GPU 3 cordoned, GPUs 0,1 held elsewhere"


def test_a_node_from_a_server_that_does_not_say_looks_as_before() -> None:
    row = node_row(NodeSummary(id="gpu-09", connected=True, gpus=1, healthy_gpus=1))

    assert row[1] == "connected"


def replica_on(uuid: str) -> ReplicaView:
    held = {
        "index": 0,
        "uuid": uuid,
        "held_by": "gpu-07",
        "reason": f"its UUID {uuid} is listed by node gpu-07 too, connected longer",
    }
    shard = {"index": 0, "node_id": "gpu-09", "gpus": [0], "gpus_held_elsewhere": [held]}
    answer = {"id": "llama-1", "model": "llama", "phase": "serving", "shards": [shard]}
    return msgspec.convert(answer, ReplicaView)


def test_a_replica_on_a_gpu_held_elsewhere_names_the_gpu_and_the_holder(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")

    print_replica(replica_on(SHARED))

    facts = [line for line in capsys.readouterr().out.splitlines() if ":" in line]
    assert (
        f"held elsewhere: shard 0 on gpu-09, GPU 0: its UUID {SHARED} is listed by node gpu-07 "
        "too, connected longer"
    ) in [" ".join(line.split()) for line in facts]


def test_a_uuid_from_the_node_is_escaped_in_the_replicas_facts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")

    print_replica(replica_on("GPU-\x1b]0;owned\x07\u202e1"))

    out = capsys.readouterr().out
    assert "GPU-\\x1b]0;owned\\x07\\u202e1" in out
    assert not {"\x1b", "\x07", "\u202e"} & set(out)
