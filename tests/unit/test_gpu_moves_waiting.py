"""Where an operator reads why a replica on an unhealthy GPU is not moved yet: the admin
API's model (``waiting_to_move``) and ``llmgw-cli model``, while its model's ``max_moves``
moves are under way."""

from __future__ import annotations

import msgspec
import pytest

from app.admin.models import model_view
from app.domain.model_status import model_status
from cli import views
from cli.models import print_model
from tests.unit.test_reconcile_gpu_moves import four_serving_on_a_node_whose_gpus_all_fail

WAITS = (
    "llama-{n} waits to move off an unhealthy GPU (GPU {gpu} of node gpu-1 is unhealthy "
    "(XID 79)): 1 move(s) of llama under way, at most 1 (max_moves) at a time"
)


def test_the_model_s_view_and_the_cli_say_why_each_gpu_move_waits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = four_serving_on_a_node_whose_gpus_all_fail(max_moves=1)
    cluster.reconcile()

    view = model_view(model_status(cluster.state, "llama", cluster.now))
    print_model(msgspec.json.decode(msgspec.json.encode(view), type=views.ModelView))

    waiting = [WAITS.format(n=n, gpu=n - 1) for n in (2, 3, 4)]
    assert view.waiting_to_move == waiting
    shown = " ".join(capsys.readouterr().out.split())
    assert all(line in shown for line in waiting)


def test_nothing_waits_once_the_model_has_room_for_another_move() -> None:
    cluster = four_serving_on_a_node_whose_gpus_all_fail(max_moves=4)
    cluster.reconcile()

    assert model_status(cluster.state, "llama", cluster.now).waiting_to_move == ()
