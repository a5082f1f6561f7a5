"""`llmgw-cli nodes` shows a GPU whose UUID another node holds, as the API says it: in the
fleet summary, after the node's state, as a cordoned GPU is. Before, such a node looked
healthy in the list."""

from __future__ import annotations

import msgspec

from cli.nodes import node_row
from cli.views import NodeSummary


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
