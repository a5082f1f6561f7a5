"""An operator rolls out a new revision on a cluster of real processes (``llmgw-server
serve``, two ``llmgw-agent`` processes with fake GPUs, the engine simulators they start)
and follows and steers it over the admin API and ``llmgw-cli rollout``: a rolling update
that succeeds, a canary paused for lack of traffic and resumed, a pause, resume and undo
with the refusals between them, a revision whose replicas fail to start rolled back by
itself while the operator watches on a terminal, and the model's rollout history."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cluster import (
    ADMIN_TOKEN,
    ADMIN_TOKEN_NAME,
    SIMULATOR_COMMAND,
    Cluster,
    ClusterPki,
    ServerProcess,
    issue_pki,
)
from tests.support.operator_cli import OnTerminal, Operator, finished
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

SUFFIX = secrets.token_hex(2)
NODES = (f"gpu-a-{SUFFIX}", f"gpu-b-{SUFFIX}")
REVISED = f"{SIMULATOR_COMMAND} --max-num-seqs 64"
"""Another revision of the simulated engine: it runs the same, with another flag."""
SLOW_TO_START = f"{SIMULATOR_COMMAND} --start-delay 1.5"
"""Another revision whose engines take a while to be ready: a rollout of it runs long
enough to be seen running."""
FAILING = f"{SIMULATOR_COMMAND} --exit-after 0"
"""A revision whose engine exits with a failure as soon as it starts."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ClusterPki:
    return issue_pki(tmp_path_factory.mktemp("rollout-pki"), NODES)


async def serving_cluster(cluster: Cluster, model: str, **spec: object) -> ServerProcess:
    """A leading server, both agents, and ``model`` with two replicas serving."""
    server = cluster.start_server()
    await cluster.wait_for_leader()
    await cluster.wait_until_serving_admin(server)
    for node in NODES:
        cluster.start_agent(node)
    await cluster.wait_for_nodes_connected(NODES)
    await cluster.apply_simulated_model(model, replicas=2, **spec)
    await cluster.wait_for_serving(model, 2)
    return server


def operator_of(server: ServerProcess, home: Path) -> Operator:
    return Operator(home=home, admin_url=server.admin_url, token=ADMIN_TOKEN)


async def rollout_of(cluster: Cluster, model: str) -> dict[str, Any]:
    answer = await cluster.admin("GET", f"/admin/v1/models/{model}/rollout")
    assert isinstance(answer, dict), answer
    return answer


async def wait_for_rollout(
    cluster: Cluster, model: str, state: str, *, within_s: float = 30.0, **fields: object
) -> dict[str, Any]:
    """The model's rollout once it is in ``state`` with ``fields``."""
    seen: list[dict[str, Any]] = []

    async def there() -> bool:
        seen[:] = [await rollout_of(cluster, model)]
        return seen[0]["state"] == state and all(seen[0][k] == v for k, v in fields.items())

    await wait_until(there, within_s=within_s, every_s=0.1, what=f"rollout {state} {fields}")
    return seen[0]


def serving_by_revision(rollout: dict[str, Any]) -> dict[str, int]:
    """Serving replicas by revision (those stopping once replaced left out)."""
    by_revision = rollout["replicas_by_revision"]
    return {rev: phases["serving"] for rev, phases in by_revision.items() if "serving" in phases}


async def steer(
    server: ServerProcess, model: str, action: str, body: object = None
) -> tuple[int, dict[str, Any]]:
    """``POST .../rollout/{action}`` as the operator: the status code and the answer."""
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        response = await client.post(
            f"{server.admin_url}/admin/v1/models/{model}/rollout/{action}", json=body
        )
    answer = response.json()
    assert isinstance(answer, dict), answer
    return response.status_code, answer


async def test_a_new_command_rolls_out_and_status_wait_follows_it_line_by_line_until_it_succeeds(
    cluster: Cluster, tmp_path: Path
) -> None:
    model = f"sim-{secrets.token_hex(2)}"
    server = await serving_cluster(cluster, model)
    operator = operator_of(server, tmp_path)
    originals = {r["id"] for r in await cluster.replicas(model=model)}

    applied = await cluster.apply_simulated_model(model, replicas=2, command=SLOW_TO_START)
    started = await rollout_of(cluster, model)
    follower = await operator.start("rollout", "status", model, "--wait")
    code, stdout, stderr = await finished(follower, 60)
    done = await rollout_of(cluster, model)
    shown = await operator.run("rollout", "status", model)
    model_line = await operator.run("model", model)
    moves = await cluster.drain(str(started["rollout_id"]))

    assert applied["model"]["revision"] == 2
    assert applied["model"]["rollout"]["rollout_id"] == f"rollout-{model}-r2"
    assert (started["rollout_id"], started["state"]) == (f"rollout-{model}-r2", "running")
    assert (started["from_revision"], started["revision"], started["model_revision"]) == (1, 2, 2)
    assert [s["replicas"] for s in started["steps"]] == ["all"]
    assert started["placement"] == f"/admin/v1/models/{model}/placement"
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert len(lines) >= 3, stdout  # a line for each change, not for each poll
    assert len(set(lines)) == len(lines)
    assert f"rollout-{model}-r2 running | step 1 of 1: 2 of 2 replica(s) on revision 2" in lines[0]
    assert "(rev 1) ->" in stdout  # a move and its replacement
    assert f"rollout-{model}-r2 succeeded" in lines[-1]
    assert "outcome: every replica runs revision 2" in lines[-1]
    assert (done["state"], done["finished"], done["outcome"]) == (
        "succeeded",
        True,
        "every replica runs revision 2",
    )
    assert serving_by_revision(done) == {"2": 2}
    assert done["moves"] == []
    assert shown.code == 0, shown.stderr
    assert f"rollout-{model}-r2: succeeded, revision 1 -> 2" in shown.stdout
    assert "explain-placement" not in shown.stdout  # no replacement is coming
    assert f"last rollout: rollout-{model}-r2 succeeded" in " ".join(model_line.stdout.split())
    moved = {r["id"] for r in moves["replicas"] if r["drain_id"] == started["rollout_id"]}
    assert moved == originals

    undone = await operator.run("rollout", "undo", model)

    assert undone.code == 0, undone.stderr
    # Revision 1's spec again, as revision 3; the answer names it by the revision it replaces.
    assert undone.stdout.startswith(f"rollout-{model}-r3: the spec before revision 2 roll"), (
        undone.stdout
    )
    assert "as revision 3" in undone.stdout.splitlines()[0]


async def test_a_canary_without_traffic_pauses_for_the_operator_whose_resume_promotes_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    model = f"sim-{secrets.token_hex(2)}"
    canary = {"steps": [{"replicas": 1, "traffic": 0.25, "hold_s": 1}]}
    server = await serving_cluster(cluster, model, rollout=canary)
    operator = operator_of(server, tmp_path)

    await cluster.apply_simulated_model(model, replicas=2, command=REVISED, rollout=canary)
    paused = await wait_for_rollout(cluster, model, "paused")
    model_line = await operator.run("model", model)
    on_hold = await operator.run("rollout", "status", model)
    waited_on_pause = await operator.run("rollout", "status", model, "--wait")
    resumed = await operator.run("rollout", "resume", model)
    follower = await operator.start("rollout", "status", model, "--wait", "--output", "json")
    code, stdout, stderr = await finished(follower, 60)
    history = await operator.run("rollout", "history", model)
    history_json = await operator.run("rollout", "history", model, "--output", "json")

    assert paused["step"] == 0
    assert serving_by_revision(paused) == {"1": 1, "2": 1}
    assert paused["canary"] == {"revision": 2, "share": 0.25}
    assert paused["verdict"].startswith("inconclusive: the gateways saw 0 request(s)")
    assert paused["pause_reason"].startswith("no verdict:")
    assert f"rollout-{model}-r2 paused, revision 1 -> 2, step 1 of 2" in " ".join(
        model_line.stdout.split()
    )
    shown = " ".join(on_hold.stdout.split())
    assert "step: 1 of 2: 1 of 2 replica(s) on revision 2, 25 % of the traffic" in shown
    assert "canary: revision 2 gets 25 % of the traffic" in shown
    assert "paused: no verdict:" in shown
    # Paused, with its one canary serving: no replacement will be placed.
    assert "explain-placement" not in shown
    # A paused rollout waits for an operator: --wait says so and ends, even with no --timeout.
    assert waited_on_pause.code == 3
    assert f"rollout-{model}-r2 is paused (no verdict:" in waited_on_pause.stderr
    assert waited_on_pause.stderr.endswith(
        f"and waits for an operator: llmgw-cli rollout resume {model} goes on, "
        f"llmgw-cli rollout undo {model} rolls it back\n"
    )
    assert resumed.code == 0, resumed.stderr
    assert resumed.stdout.startswith(
        f"rollout-{model}-r2: resumed, step 1 of 2 promoted (its verdict was not reached: "
        "the resume stands for it); step 2 starts\n"
    )
    assert code == 0, stderr
    assert json.loads(stdout)["state"] == "succeeded"
    assert history.code == 0, history.stderr
    told = history.stdout
    assert f"rollout-{model}-r2: revision 1 -> 2, succeeded" in told
    assert f"by {ADMIN_TOKEN_NAME}" in told
    assert "changed: command" in told
    assert "step 1 verdict inconclusive" in told
    assert f"{ADMIN_TOKEN_NAME:<10} resumed" in told
    [record] = history_json.json()["rollouts"]
    kinds = [e["type"] for e in record["events"]]
    assert kinds[:2] == ["rollout_started", "rollout_step_started"]
    assert "rollout_verdict" in kinds
    assert kinds[-1] == "rollout_finished"
    [verdict] = [e for e in record["events"] if e["type"] == "rollout_verdict"]
    assert verdict["data"]["canary"]["requests"] == 0 or verdict["data"]["canary"] is None
    [resume] = [e for e in record["events"] if e["type"] == "rollout_resumed"]
    assert (resume["actor"], resume["correlation_id"]) == (ADMIN_TOKEN_NAME, f"rollout-{model}-r2")


async def test_pause_resume_and_undo_round_trip_and_what_cannot_be_done_is_a_409(
    cluster: Cluster, tmp_path: Path
) -> None:
    model = f"sim-{secrets.token_hex(2)}"
    held = {"steps": [{"replicas": 1, "hold_s": 600}]}
    server = await serving_cluster(cluster, model, rollout=held)
    operator = operator_of(server, tmp_path)

    await cluster.apply_simulated_model(model, replicas=2, command=REVISED, rollout=held)
    holding = await wait_until_holding(cluster, model)
    noop_resume = await steer(server, model, "resume")
    paused = await steer(server, model, "pause", {"reason": "looking at TTFT"})
    paused_again = await steer(server, model, "pause")
    waited_on_pause = await operator.run("rollout", "status", model, "--wait", "--timeout", "1")
    resumed = await steer(server, model, "resume")
    undone = await steer(server, model, "undo")
    rolled_back = await wait_for_rollout(cluster, model, "rolled_back")
    undo_again = await steer(server, model, "undo")
    pause_after = await steer(server, model, "pause")
    status = await operator.run("rollout", "status", model)
    cli_undo = await operator.run("rollout", "undo", model)
    log = await cluster.events(
        "rollout_paused", "rollout_resumed", "rollout_rolled_back", "rollout_finished"
    )

    assert 0 < holding["hold_left_s"] <= 600
    assert holding["verdict_waits_for"] == (
        "the gateways saw 0 request(s) to the new revision and 0 to the others, "
        "fewer than min_requests 20"
    )
    assert serving_by_revision(holding) == {"1": 1, "2": 1}
    assert (noop_resume[0], noop_resume[1]["changed"]) == (200, False)
    assert (paused[0], paused[1]["changed"]) == (200, True)
    assert paused[1]["rollout"]["state"] == "paused"
    assert paused[1]["rollout"]["pause_reason"] == "looking at TTFT"
    assert (paused_again[0], paused_again[1]["changed"]) == (200, False)
    assert waited_on_pause.code == 3
    assert waited_on_pause.stderr.endswith(
        f"rollout-{model}-r2 is paused (looking at TTFT) and waits for an operator: "
        f"llmgw-cli rollout resume {model} goes on, llmgw-cli rollout undo {model} rolls it "
        "back\n"
    )
    assert (resumed[0], resumed[1]["rollout"]["state"]) == (200, "running")
    assert (undone[0], undone[1]["changed"]) == (200, True)
    assert undone[1]["rollout"]["state"] == "rolling_back"
    assert undone[1]["rollout"]["model_revision"] == 1
    assert serving_by_revision(rolled_back) == {"1": 2}
    assert rolled_back["outcome"] == "rolled back to revision 1: undone by an operator"
    assert undo_again[0] == 409
    assert undo_again[1]["title"] == "invalid-operation"
    assert undo_again[1]["detail"].startswith(
        f"rollout rollout-{model}-r2 cannot be undone: it was rolled back to revision 1"
    )
    assert pause_after[0] == 409
    assert "cannot be paused" in pause_after[1]["detail"]
    assert status.code == 1  # the rollout shown was rolled back
    assert f"rollout-{model}-r2: rolled back, revision 1 -> 2 (model {model} at revision 1)" in (
        status.stdout
    )
    assert cli_undo.code == 1
    assert "cannot be undone: it was rolled back" in cli_undo.stderr
    steps = [(e.type, e.actor, e.correlation_id) for e in log if e.get("model") == model]
    rollout_id = f"rollout-{model}-r2"
    assert steps == [
        ("rollout_paused", ADMIN_TOKEN_NAME, rollout_id),
        ("rollout_resumed", ADMIN_TOKEN_NAME, rollout_id),
        ("rollout_rolled_back", ADMIN_TOKEN_NAME, rollout_id),
        ("rollout_finished", "reconciler", rollout_id),
    ]


async def wait_until_holding(cluster: Cluster, model: str) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    async def holds() -> bool:
        seen[:] = [await rollout_of(cluster, model)]
        return seen[0]["hold_left_s"] is not None

    await wait_until(holds, within_s=30, every_s=0.1, what="the step's hold")
    return seen[0]


async def test_a_revision_that_fails_to_start_is_rolled_back_while_the_operator_watches_live(
    cluster: Cluster, tmp_path: Path
) -> None:
    model = f"sim-{secrets.token_hex(2)}"
    server = await serving_cluster(cluster, model, rollout={"max_failures": 1})
    operator = operator_of(server, tmp_path)
    originals = sorted(r["id"] for r in await cluster.replicas(model=model, phase="serving"))

    await cluster.apply_simulated_model(
        model, replicas=2, command=FAILING, rollout={"max_failures": 1}
    )
    watcher = OnTerminal.start(operator, "rollout", "status", model, "--wait")
    try:
        code = await watcher.exit_code()
    finally:
        watcher.kill()
    shown = watcher.text()
    serving = sorted(r["id"] for r in await cluster.replicas(model=model, phase="serving"))
    done = await rollout_of(cluster, model)

    assert code == 1, shown
    assert f"rollout-{model}-r2: rolled back, revision 1 -> 2" in shown
    assert "failures: 1 of 1 that roll it back; last:" in shown
    assert f"rollout-{model}-r2 rolled back: rolled back to revision 1" in shown
    assert (done["state"], done["failures"], done["model_revision"]) == ("rolled_back", 1, 1)
    assert serving == originals  # the old replicas were never touched
