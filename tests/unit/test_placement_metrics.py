"""The /metrics page's placement families count each node's rejection by what the
reconciler holds: a GPU an ended replica's engine still runs on is not free there."""

from __future__ import annotations

from app.admin.metrics import fold_families, placement_families
from app.domain.events import GpuMarkedUnhealthy, GpuRecovered, ModelUnplaceable
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


def gpu_counts(cluster: Cluster) -> dict[str, float]:
    families = {f.name: f for f in fold_families(cluster.state, cluster.reports)}
    return {s.labels["state"]: s.value for s in families["llmgw_gpus"].samples}


def test_the_gpus_family_counts_the_unhealthy_gpus_now_and_forgets_one_that_recovered() -> None:
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=2)
    cluster.node("gpu-2", n_gpus=1)
    healthy = gpu_counts(cluster)

    cluster.given(
        GpuMarkedUnhealthy(
            node_id="gpu-1",
            gpu_index=1,
            gpu_uuid="GPU-gpu-1-1",
            reason="XID 48: double-bit ECC error",
        )
    )
    faulty = gpu_counts(cluster)
    cluster.given(GpuRecovered(node_id="gpu-1", gpu_index=1, gpu_uuid="GPU-gpu-1-1"))

    assert healthy == {"healthy": 3, "unhealthy": 0}
    assert faulty == {"healthy": 2, "unhealthy": 1}
    assert gpu_counts(cluster) == healthy
