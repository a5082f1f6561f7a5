"""The /metrics page's placement families count each node's rejection by what the
reconciler holds: a GPU an ended replica's engine still runs on is not free there."""

from __future__ import annotations

from app.admin.metrics import placement_families
from app.domain.events import ModelUnplaceable
from app.domain.placement import Rejection
from tests.unit.test_reconcile import Cluster, of_type


def rejections(cluster: Cluster, model: str) -> dict[str, float]:
    families = {f.name: f for f in placement_families(cluster.state, cluster.reports)}
    return {
        s.labels["reason"]: s.value
        for s in families["llmgw_placement_rejections"].samples
        if s.labels["model"] == model
    }


def test_a_gpu_an_engine_still_runs_on_is_counted_as_the_reconciler_counts_it() -> None:
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=1)
    cluster.model("qwen", replicas=0)
    cluster.failed_still_running("gpu-1", "qwen-1", "qwen")
    cluster.model("llama", replicas=1)
    cluster.after(31)

    assert of_type(cluster.reconcile(), ModelUnplaceable)  # gpu-1's GPU is held
    counted = rejections(cluster, "llama")

    assert counted[Rejection.GPUS.value] == 1
    assert sum(counted.values()) == 1
