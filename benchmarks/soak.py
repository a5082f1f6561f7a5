"""Soak: mixed client traffic at 70 % of capacity for ten minutes while a chaos loop drains
and uncordons nodes, kills and restarts agents, and kills the leading control plane.

    python benchmarks/soak.py [--duration 600] [--capacity RPS] [--load 0.7] [--seed 1]
        [--chaos-pause 10] [--window 30] [--workdir DIR]

The cluster is the one the end-to-end tests run (``tests/support/cluster.py``), on a fresh
database: two ``llmgw-server serve`` (a leader and a standby, restarted a second after
they die, as systemd's ``Restart=on-failure`` does), four ``llmgw-agent`` with two fake
GPUs each, a model of two replicas of the engine simulator with a capacity model (8
sequences at once, 10 ms per decode step), and a standalone ``llmgw-server gateway`` the
clients use (``tests/support/traffic.py``: ``openai.AsyncOpenAI`` clients, SDK retries
off, chat and text completions, streamed and not, in turn).

1. **Capacity**: ``--capacity`` requests/s, or measured first: closed-loop clients, as many
   as the replicas run sequences at once, for ``--measure-seconds``; what they get through
   is the capacity (of the replicas and, on a small machine, of the machine).
2. **Soak**: clients paced to ``--load`` x capacity requests/s for ``--duration`` seconds.
   A client told 429 with ``Retry-After`` waits as told. Meanwhile, one chaos action
   after another (each kind once a round, in a seeded order), each followed by the
   recovery it needs and ``--chaos-pause``: drain the node of a serving replica until the
   drain finishes, then uncordon it; SIGKILL an agent, restart it 1-4 s later and wait
   until its node is connected again; SIGKILL the leader and wait for a new term with
   every node connected to it. Traffic goes on until the last action has recovered.
3. **Report**: requests sent and served, failures by kind (the target is none but 429s
   with ``Retry-After``), latency p50/p99 per ``--window`` seconds with the chaos actions
   of each window, every chaos action with its recovery time, the events appended by
   type, and ``llmgw-server projections rebuild --verify``.

Results are printed and written to ``benchmarks/results/soak-<timestamp>.json``;
``docs/performance.md`` ("Soak") discusses them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import msgspec

# Run as a script, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.simulator.launcher import simulator_command
from benchmarks.common import (
    bench_server,
    format_table,
    fresh_database,
    load_average,
    percentile,
    stop_on_sigterm,
    write_results,
)
from tests.support.cluster import Cluster, JsonObject, ServerSettings, about, issue_pki
from tests.support.databases import TEST_RUNTIME_ROLE
from tests.support.traffic import Outcome, Traffic, serves
from tests.support.waiting import wait_until

MODEL = "soak"
NODES = ("soak-a", "soak-b", "soak-c", "soak-d")
REPLICAS = 2
MAX_NUM_SEQS = 8
MAX_TOKENS = 16
ENGINE = (
    f"{simulator_command()} --port {{port}} --model {{model}} --max-num-seqs {MAX_NUM_SEQS} "
    "--decode-base-ms 10 --decode-per-seq-ms 0.5 --prefill-ms-per-token 0.05"
)
SETTINGS = ServerSettings(
    adoption_grace_s=15.0, lost_timeout_s=30.0, stability_window_s=2.0, reconcile_interval_s=0.5
)
"""A lost timeout well above an agent's restart here (1-4 s and its reconnect backoff):
a killed agent's replicas are adopted when it is back, never replaced."""
RECOVERY_S = 90.0
CLIENTS_PER_CONCURRENT = 3
"""Paced clients per request expected in flight, so that one slow answer does not make
the offered rate fall behind."""


class Window(msgspec.Struct, frozen=True):
    start_s: int
    sent: int
    served: int
    failed: int
    p50_ms: float | None
    p99_ms: float | None
    chaos: list[str]


class ChaosAction(msgspec.Struct, frozen=True):
    at_s: float
    action: str
    recovered_in_s: float | None
    error: str | None = None


class Results(msgspec.Struct, frozen=True):
    command: str
    duration_s: float
    soaked_s: float
    """Longer than ``duration_s`` by the recovery of the last chaos action."""
    capacity_rps: float
    capacity_measured: bool
    offered_rps: float
    clients: int
    load_average_before: tuple[float, float, float]
    load_average_after: tuple[float, float, float]
    sent: int
    served: int
    failures_by_kind: dict[str, int]
    backpressure_429: int
    untolerated_failures: int
    first_failures: list[str]
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    window_s: int
    windows: list[Window]
    chaos: list[ChaosAction]
    server_restarts: int
    events_appended: int
    events_by_type: dict[str, int]
    verify_exit_code: int
    verify_output: str


# -- the cluster -----------------------------------------------------------------------


async def start_cluster(cluster: Cluster) -> str:
    """Leader, standby, agents, the model serving, a gateway and a key; the gateway URL
    and the key."""
    cluster.start_server()
    await cluster.wait_for_leader()
    cluster.start_server()
    for node in NODES:
        cluster.start_agent(node)
    await cluster.wait_for_nodes_connected(NODES)
    await cluster.apply_simulated_model(MODEL, replicas=REPLICAS, command=ENGINE)
    await cluster.wait_for_serving(MODEL, REPLICAS, within_s=60.0)
    return await cluster.create_key("soak", [MODEL])


async def measure_capacity(url: str, key: str, seconds: float) -> float:
    """Requests/s that closed-loop clients, one per sequence the replicas run at once, get
    through."""
    clients = REPLICAS * MAX_NUM_SEQS
    async with Traffic(url, key, MODEL, clients=clients, max_tokens=MAX_TOKENS) as traffic:
        await asyncio.sleep(3.0)  # warm-up, not counted
        counted_from = len(traffic.outcomes)
        started = time.monotonic()
        await asyncio.sleep(seconds)
        served = sum(o.ok for o in traffic.outcomes[counted_from:])
        elapsed = time.monotonic() - started
    return served / elapsed


# -- chaos -----------------------------------------------------------------------------


async def drain_and_uncordon(cluster: Cluster, rng: random.Random) -> str:
    serving = await cluster.replicas(model=MODEL, phase="serving")
    hosting = sorted({node for replica in serving for node in nodes_of(replica)})
    node = rng.choice(hosting)
    drain_id = await cluster.drain_node(node, grace_s=RECOVERY_S)
    await cluster.wait_for_event(
        "node_drain_finished", about(drain_id=drain_id), within_s=RECOVERY_S
    )
    await cluster.admin("POST", f"/admin/v1/nodes/{node}/uncordon")
    return f"drain {node}"


def nodes_of(replica: JsonObject) -> list[str]:
    nodes = replica["nodes"]
    assert isinstance(nodes, list), replica
    return [str(node) for node in nodes]


async def kill_and_restart_agent(cluster: Cluster, rng: random.Random) -> str:
    node = rng.choice(NODES)
    mark = await cluster.last_position()
    agent = cluster.agents[node]
    agent.kill()
    await asyncio.to_thread(agent.process.wait)
    down_s = rng.uniform(1.0, 4.0)
    await asyncio.sleep(down_s)
    cluster.start_agent(node)
    await cluster.wait_for_event(
        "node_connected", about(node_id=node), after=mark, within_s=RECOVERY_S
    )
    return f"kill agent {node} ({down_s:.1f} s down)"


async def kill_leader(cluster: Cluster, rng: random.Random) -> str:
    term = await cluster.leadership()
    assert term is not None
    leader = next(s for s in cluster.servers if s.server_id == term.holder)
    mark = await cluster.last_position()
    leader.kill()
    await cluster.wait_for_leader(after_epoch=term.epoch, within_s=RECOVERY_S)
    for node in NODES:
        await cluster.wait_for_event(
            "node_connected", about(node_id=node), after=mark, within_s=RECOVERY_S
        )
    return f"kill leader {leader.server_id}"


ACTIONS: Sequence[Callable[[Cluster, random.Random], Awaitable[str]]] = (
    drain_and_uncordon,
    kill_and_restart_agent,
    kill_leader,
)


async def chaos_loop(
    cluster: Cluster, rng: random.Random, pause_s: float, until: float, origin: float
) -> list[ChaosAction]:
    """One action after another until ``until`` (monotonic), each with its recovery: every
    kind once in each round, in an order of the seed's choosing."""
    done: list[ChaosAction] = []
    round_: list[Callable[[Cluster, random.Random], Awaitable[str]]] = []
    while time.monotonic() + pause_s < until:
        await asyncio.sleep(pause_s)
        if not round_:
            round_ = rng.sample(ACTIONS, len(ACTIONS))
        action = round_.pop()
        started = time.monotonic()
        try:
            what = await action(cluster, rng)
        except Exception as exc:  # a recovery that never came is a finding, not a crash
            done.append(ChaosAction(started - origin, action.__name__, None, repr(exc)))
            print(f"  +{started - origin:5.0f}s {action.__name__}: FAILED {exc!r}", flush=True)
            continue
        recovered = time.monotonic() - started
        done.append(ChaosAction(round(started - origin, 1), what, round(recovered, 2)))
        print(f"  +{started - origin:5.0f}s {what}: recovered in {recovered:.1f}s", flush=True)
    return done


# -- the report ------------------------------------------------------------------------


def windows(
    outcomes: Sequence[Outcome], chaos: Sequence[ChaosAction], origin: float, width_s: int
) -> list[Window]:
    count = max((int((o.started_at - origin) // width_s) for o in outcomes), default=-1) + 1
    found = []
    for index in range(count):
        inside = [o for o in outcomes if int((o.started_at - origin) // width_s) == index]
        served = [o.latency_s * 1000 for o in inside if o.ok]
        found.append(
            Window(
                start_s=index * width_s,
                sent=len(inside),
                served=len(served),
                failed=len(inside) - len(served),
                p50_ms=round(percentile(served, 50), 1) if served else None,
                p99_ms=round(percentile(served, 99), 1) if served else None,
                chaos=[c.action for c in chaos if int(c.at_s // width_s) == index],
            )
        )
    return found


def print_report(results: Results) -> None:
    print()
    print(
        format_table(
            ["window (s)", "sent", "served", "failed", "p50 ms", "p99 ms", "chaos"],
            [
                [
                    f"{w.start_s}-{w.start_s + results.window_s}",
                    str(w.sent),
                    str(w.served),
                    str(w.failed),
                    f"{w.p50_ms}",
                    f"{w.p99_ms}",
                    "; ".join(w.chaos),
                ]
                for w in results.windows
            ],
        )
    )
    print()
    print(f"capacity {results.capacity_rps:.1f} req/s, offered {results.offered_rps:.1f} req/s")
    print(f"soaked {results.soaked_s} s with {results.clients} clients")
    print(f"sent {results.sent}, served {results.served}")
    print(f"failures by kind: {results.failures_by_kind or 'none'}")
    print(f"failures other than 429 with Retry-After: {results.untolerated_failures}")
    for line in results.first_failures:
        print(f"  {line}")
    print(f"latency p50 {results.latency_p50_ms} ms, p99 {results.latency_p99_ms} ms")
    print(f"chaos actions: {len(results.chaos)}, server restarts: {results.server_restarts}")
    print(f"events appended: {results.events_appended} {results.events_by_type}")
    print(f"rebuild --verify: exit {results.verify_exit_code}: {results.verify_output.strip()}")


# -- the run ---------------------------------------------------------------------------


async def soak(arguments: argparse.Namespace, workdir: Path) -> Results:
    rng = random.Random(arguments.seed)
    with bench_server() as server:
        async with fresh_database(server, "llmgw_soak", TEST_RUNTIME_ROLE) as url:
            pki = issue_pki(workdir / "pki")
            async with Cluster(url, workdir, pki, settings=SETTINGS) as cluster:
                return await soak_cluster(cluster, arguments, rng)


async def soak_cluster(
    cluster: Cluster, arguments: argparse.Namespace, rng: random.Random
) -> Results:
    key = await start_cluster(cluster)
    gateway = await cluster.start_gateway()
    await wait_until(lambda: serves(gateway.url, key, MODEL), what="the gateway routes")
    measured = arguments.capacity is None
    capacity = arguments.capacity or await measure_capacity(
        gateway.url, key, arguments.measure_seconds
    )
    offered = capacity * arguments.load
    expected_in_flight = REPLICAS * MAX_NUM_SEQS * arguments.load
    clients = max(4, round(expected_in_flight * CLIENTS_PER_CONCURRENT))
    print(f"capacity {capacity:.1f} req/s; offering {offered:.1f} req/s with {clients} clients")
    first_position = await cluster.last_position()
    before = load_average()
    async with cluster.supervised() as exits:
        traffic = Traffic(
            gateway.url,
            key,
            MODEL,
            clients=clients,
            max_tokens=MAX_TOKENS,
            rate_per_s=offered,
            honour_retry_after=True,
        )
        origin = time.monotonic()
        async with traffic:
            chaos = await chaos_loop(
                cluster, rng, arguments.chaos_pause, origin + arguments.duration, origin
            )
            await asyncio.sleep(max(0.0, origin + arguments.duration - time.monotonic()))
        soaked = time.monotonic() - origin
    after = load_average()
    await cluster.wait_for_serving(MODEL, REPLICAS, within_s=RECOVERY_S)
    verified = await cluster.verify_projections()
    appended = await cluster.events(after=first_position)
    outcomes = traffic.outcomes
    served = [o.latency_s * 1000 for o in outcomes if o.ok]
    failed = traffic.failures()
    untolerated = traffic.failures(tolerate_backpressure=True)
    return Results(
        command=" ".join(["python", "benchmarks/soak.py", *sys.argv[1:]]),
        duration_s=arguments.duration,
        soaked_s=round(soaked, 1),
        capacity_rps=round(capacity, 1),
        capacity_measured=measured,
        offered_rps=round(offered, 1),
        clients=clients,
        load_average_before=before,
        load_average_after=after,
        sent=len(outcomes),
        served=len(served),
        failures_by_kind=dict(Counter(o.kind for o in failed)),
        backpressure_429=sum(o.backpressure for o in failed),
        untolerated_failures=len(untolerated),
        first_failures=[
            f"+{o.started_at - origin:.1f}s {o.call}: {o.kind} {o.detail}" for o in untolerated[:10]
        ],
        latency_p50_ms=round(percentile(served, 50), 1) if served else None,
        latency_p99_ms=round(percentile(served, 99), 1) if served else None,
        window_s=arguments.window,
        windows=windows(outcomes, chaos, origin, arguments.window),
        chaos=chaos,
        server_restarts=len(exits),
        events_appended=len(appended),
        events_by_type=dict(Counter(e.type for e in appended).most_common()),
        verify_exit_code=verified.returncode,
        verify_output=verified.stdout + verified.stderr,
    )


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of soak")
    parser.add_argument("--capacity", type=float, help="requests/s; measured when not given")
    parser.add_argument("--measure-seconds", type=float, default=20.0)
    parser.add_argument("--load", type=float, default=0.7, help="share of the capacity")
    parser.add_argument("--seed", type=int, default=1, help="of the chaos loop's choices")
    parser.add_argument("--chaos-pause", type=float, default=10.0, help="seconds between")
    parser.add_argument("--window", type=int, default=30, help="seconds per latency window")
    parser.add_argument("--workdir", type=Path, help="keep the processes' logs here")
    arguments = parser.parse_args(argv)
    if arguments.duration <= 0 or not 0 < arguments.load <= 1 or arguments.window < 1:
        parser.error("--duration and --window must be positive, --load in (0, 1]")
    return arguments


def main(argv: Sequence[str] | None = None) -> int:
    stop_on_sigterm()
    arguments = parse_arguments(argv)
    if arguments.workdir is not None:
        arguments.workdir.mkdir(parents=True, exist_ok=True)
        results = asyncio.run(soak(arguments, arguments.workdir))
    else:
        with tempfile.TemporaryDirectory(prefix="llmgw-soak-") as directory:
            results = asyncio.run(soak(arguments, Path(directory)))
    print_report(results)
    print(f"results: {write_results('soak', results)}")
    return 0 if results.untolerated_failures == 0 and results.verify_exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
