"""`llmgw-cli node NODE` names each GPU by its index and its whole UUID on one row, as the
node's history and `nvidia-smi -L` name it, within 100 columns; a GPU whose UUID was
never read shows none; a UUID the node sent is escaped like anything else it sends. The
node is the admin API's JSON, decoded as the CLI decodes it."""

from __future__ import annotations

import msgspec
import pytest

from cli.nodes import print_node
from cli.views import NodeView

H100 = "NVIDIA H100 80GB HBM3"
UUIDS = [f"GPU-84bba079-31db-9253-06a0-799dc6ebd71{i}" for i in range(8)]


def _gpu(index: int, uuid: str, **health: object) -> dict[str, object]:
    """One GPU as the admin API's node view gives it."""
    return {
        "index": index,
        "uuid": uuid,
        "name": H100,
        "memory_total_mib": 81559,
        "memory_used_mib": 0,
        "memory_free_mib": 81559,
        "healthy": True,
        "unhealthy_reason": None,
        "used_by": None,
        "excluded_because": None,
        **health,
    }


def _node(gpus: list[dict[str, object]]) -> NodeView:
    answer = {"id": "gpu-08", "connection": {"connected": True}, "gpus": gpus}
    return msgspec.json.decode(msgspec.json.encode(answer), type=NodeView)


def _busy_node(uuids: list[str]) -> NodeView:
    """Eight GPUs: four used by a replica, one fallen off the bus, the rest free."""
    replica = "llama-3-70b-0f3a"
    used = {"memory_used_mib": 70000, "used_by": replica}
    fallen = "XID 79: GPU has fallen off the bus"
    return _node(
        [
            _gpu(i, uuid, **used, excluded_because=f"used by replica {replica}")
            if i < 4
            else _gpu(i, uuid, healthy=False, excluded_because=f"unhealthy: {fallen}")
            if i == 5
            else _gpu(i, uuid)
            for i, uuid in enumerate(uuids)
        ]
    )


def _gpu_rows(capsys: pytest.CaptureFixture[str], node: NodeView) -> dict[int, list[str]]:
    """Each GPU's first table line, split into its cells, by the GPU's index."""
    print_node(node)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100, out
    rows: dict[int, list[str]] = {}
    for line in out.split("GPUs", 1)[1].splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells and cells[0].isdigit():
            rows[int(cells[0])] = cells
    return rows


def test_each_gpu_row_holds_its_whole_uuid_in_100_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")

    rows = _gpu_rows(capsys, _busy_node(UUIDS))

    assert {index: cells[1] for index, cells in rows.items()} == dict(enumerate(UUIDS))


def test_a_gpu_whose_uuid_was_never_read_shows_none(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    uuids = [*UUIDS[:6], "", UUIDS[7]]

    rows = _gpu_rows(capsys, _busy_node(uuids))

    assert (rows[6][1], rows[7][1]) == ("", UUIDS[7])


def test_a_uuid_from_the_node_is_escaped_before_it_reaches_the_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")

    print_node(_node([_gpu(0, "GPU-\x1b]0;owned\x07\u202e1")]))

    out = capsys.readouterr().out
    assert "│ GPU-\\x1b]0;owned\\x07\\u202e1 │" in out
    assert not {"\x1b", "\x07", "\u202e"} & set(out)
