"""Stories of strays a node does not stop: each is recorded once, however many it reports
and however many passes run while its stop is on its way (or never obeyed)."""

from __future__ import annotations

from app.domain.events import StrayStopped
from app.domain.state import STRAYS_REMEMBERED
from tests.unit.test_reconcile import Cluster, commands, of_type

MANY = STRAYS_REMEMBERED + 36


def a_node_reporting_strays(count: int) -> Cluster:
    """gpu-1 reports ``count`` engines the log never placed, past the adoption grace."""
    cluster = Cluster()
    cluster.node("gpu-1")
    for n in range(count):
        cluster.running("gpu-1", f"ghost-{n}", 20000 + n, pid=1000 + n)
    cluster.after(31)
    return cluster


def test_more_strays_than_a_node_remembers_are_not_recorded_again_at_every_pass() -> None:
    """Before, a node remembered the last 64 strays it was told to stop, and a node that
    reported 100 and stopped none had all 100 recorded again at every pass (every second),
    forever: its forgotten ones were new again. Now the strays wait for room in the
    node's memory: the first 64 are recorded and stopped, the others once those stop."""
    cluster = a_node_reporting_strays(MANY)

    first = cluster.reconcile()
    later = [cluster.reconcile() for _ in range(3)]

    assert [len(of_type(decision, StrayStopped)) for decision in later] == [0, 0, 0]
    assert len(of_type(first, StrayStopped)) == STRAYS_REMEMBERED
    stopped = [f"stray-ghost-{n}-0-{1000 + n}" for n in range(STRAYS_REMEMBERED)]
    assert commands(first) == sorted(stopped)


def test_the_strays_that_waited_are_recorded_and_stopped_once_the_first_ones_stop() -> None:
    cluster = a_node_reporting_strays(MANY)
    cluster.reconcile()

    for n in range(STRAYS_REMEMBERED):
        cluster.running("gpu-1", f"ghost-{n}", 20000 + n, pid=1000 + n, state="stopped")
    decision = cluster.reconcile()

    waited = [f"ghost-{n}" for n in range(STRAYS_REMEMBERED, MANY)]
    assert [s.replica_id for s in of_type(decision, StrayStopped)] == waited
    assert commands(decision) == sorted(f"stray-{r}-0-{1000 + int(r[6:])}" for r in waited)
    assert of_type(cluster.reconcile(), StrayStopped) == []
