"""``llmgw-cli explain-placement``'s rows: what a node would use is shown only for a node
that can take a shard, with the ports it passes over because another process holds them; one
that cannot shows its reasons alone."""

from __future__ import annotations

from cli.placement import candidate_row
from cli.views import CandidateView

WOULD_USE = 4


def test_an_eligible_node_shows_the_gpus_and_port_it_would_use() -> None:
    node = CandidateView(node_id="gpu-4", eligible=True, gpus=[0, 1], port=30700, usable_gpus=2)

    assert candidate_row(node)[WOULD_USE] == "GPUs 0,1, port 30700"


def test_an_eligible_node_names_the_ports_it_skips_as_held_by_another_process() -> None:
    node = CandidateView(
        node_id="gpu-4",
        eligible=True,
        gpus=[0],
        port=30701,
        usable_gpus=2,
        ports_skipped=[30700],
    )

    assert candidate_row(node)[WOULD_USE] == ("GPUs 0, port 30701 (30700 held by another process)")


def test_a_node_short_of_gpus_shows_nothing_it_would_use() -> None:
    node = CandidateView(
        node_id="gpu-5",
        eligible=False,
        reasons=["needs 2 healthy GPU(s), has 1: GPU 0 used by tall-3"],
        gpus=[1],
        port=30801,
        usable_gpus=1,
    )

    row = candidate_row(node)

    assert row[WOULD_USE] == "", "it cannot take the shard: GPU 1 alone is not enough"
    assert row[-2] == "needs 2 healthy GPU(s), has 1: GPU 0 used by tall-3"
