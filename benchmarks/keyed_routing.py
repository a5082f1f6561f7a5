"""Keyed routing (``prefix``, ``session``): what a request costs the router, and how many
keys change replica when the replicas or their weights change.

    python benchmarks/keyed_routing.py [--replicas 2 10 64] [--requests 2000]
        [--concurrency 12] [--passes 9] [--keys 100000] [--rounds 3] [--baseline CHECKOUT]

**Cost.** One ``Router`` per replica count and case, its model under the ``session``
policy and its replicas idle but for the requests the benchmark holds open (no scrapers:
each replica is judged by the gateway's own in-flight count, as with stale signals). Per
request, the time of ``Router.acquire`` with a session key (the key's hash is made
beforehand: it does not depend on the replicas), ``--concurrency`` leases open, released
oldest first. The cases:

* ``equal``: every replica of weight 1 (a model's replicas are, unless bench tuned one of
  them), keys spread over ``--requests / 4`` sessions;
* ``distinct``: each replica a weight of its own (1 to 2), keys spread likewise;
* ``one key``: distinct weights and every request of one session, so its home fills up to
  its bound and the rest are passed on down the key's walk;
* ``one free``: distinct weights, every request a key never seen before, and every replica
  but one saturated (``target_waiting`` 1 and two requests held open on it), so each
  request is walked past a share of the replicas to the free one, and released at once.

The figure per replica count and case is the median over ``--passes`` passes of each
pass's median (and p99), in microseconds.

**Movement.** ``--keys`` session keys routed with every replica idle (so each goes to its
home), before and after a change, through a router fed the table before and the table
after:

* ``add weight-2``: four replicas of weight 1, then a fifth of weight 2;
* ``bench 1 -> 2``: five replicas of weight 1, then one of them of weight 2.

Per change: the share of keys that changed replica, the least that must (the share the
changed replica gains, or that it gains or loses by its new weight), and the share that
moved between two replicas neither of which changed (which a stable scheme keeps at 0).

With ``--baseline``, each round runs the measurement in that checkout (by its own
``.venv``) and then in this one, in turn, so both see the same machine; the figures are
the medians over ``--rounds`` rounds. Run it under ``flock /tmp/llmgw-bench.lock`` on a
shared machine. Only the router's public interface is used, so a checkout of any version
with ``Router`` and ``RouteKey`` can be the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from app.gateway.affinity import RouteKey
from app.gateway.lease import Lease
from app.gateway.router import Router
from app.gateway.table import GatewaySnapshot, Route, RoutePolicy

HERE = Path(__file__).resolve().parent
MODEL = "bench-model"
CHANGES = ("add weight-2", "bench 1 -> 2")
CASES = ("equal", "distinct", "one key", "one free")
Figures = dict[str, dict[str, dict[str, float]]]
"""One round's: ``cost`` per "<replicas>, <case>" and ``movement`` per change."""


def _key(n: int) -> int:
    digest = hashlib.blake2b(f"session-{n}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _snapshot(weights: dict[str, float], target_waiting: int = 5) -> GatewaySnapshot:
    routes = tuple(
        Route(
            replica_id=replica,
            model=MODEL,
            url=f"http://{replica}",
            weight=weight,
            target_waiting=target_waiting,
        )
        for replica, weight in weights.items()
    )
    return GatewaySnapshot(
        declared=frozenset({MODEL}),
        routes={MODEL: routes},
        policies={MODEL: RoutePolicy(policy="session")},
    )


async def cost(
    replicas: int, case: str, requests: int, concurrency: int, passes: int
) -> dict[str, float]:
    """Median over passes of the median and p99 of ``Router.acquire``, microseconds."""
    spread = 0.0 if case == "equal" else 1.0
    router = Router()
    weights = {f"r-{n}": 1.0 + spread * n / replicas for n in range(replicas)}
    open_leases: list[Lease] = []
    saturated: list[Lease] = []
    if case == "one free":
        router.update(_snapshot(weights, target_waiting=1))
        for replica in list(weights)[1:]:  # two open on each but r-0: saturated when stale
            others = frozenset(weights) - {replica}
            saturated += [await router.acquire(MODEL, "bench", exclude=others) for _ in "ab"]
        concurrency = 0
    else:
        router.update(_snapshot(weights))
    sessions = 1 if case == "one key" else requests // 4
    clock = time.perf_counter_ns
    medians: list[float] = []
    p99s: list[float] = []
    for number in range(1 + passes):  # the first pass warms caches and the allocator
        if case == "one free":  # keys never seen before
            fresh = range(requests * (number + 1), requests * (number + 2))
            keys = [RouteKey("session", _key(n)) for n in fresh]
        else:
            keys = [RouteKey("session", _key(n % sessions)) for n in range(requests)]
        samples: list[float] = []
        for key in keys:
            started = clock()
            lease = await router.acquire(MODEL, "bench", route_key=key)
            samples.append((clock() - started) / 1000)
            open_leases.append(lease)
            if len(open_leases) > concurrency:
                open_leases.pop(0).release()
        if number:
            samples.sort()
            medians.append(statistics.median(samples))
            p99s.append(samples[int(len(samples) * 0.99)])
    for lease in open_leases + saturated:
        lease.release()
    return {"p50_us": statistics.median(medians), "p99_us": statistics.median(p99s)}


async def homes(weights: dict[str, float], keys: list[int]) -> list[str]:
    """Where each key goes with every replica idle."""
    router = Router()
    router.update(_snapshot(weights))
    chosen = []
    for key in keys:
        lease = await router.acquire(MODEL, "bench", route_key=RouteKey("session", key))
        chosen.append(lease.route.replica_id)
        lease.release()
    return chosen


async def movement(change: str, count: int) -> dict[str, float]:
    """Shares of keys (percent) that moved, that must move, and that moved between two
    replicas that did not change."""
    four = {f"r-{n}": 1.0 for n in range(1, 5)}
    five = {f"r-{n}": 1.0 for n in range(1, 6)}
    if change == "add weight-2":
        before, after, changed = four, {**four, "r-5": 2.0}, "r-5"
    else:
        before, after, changed = five, {**five, "r-1": 2.0}, "r-1"
    keys = [_key(n) for n in range(count)]
    one, other = await homes(before, keys), await homes(after, keys)
    moved = [(a, b) for a, b in zip(one, other, strict=True) if a != b]
    between_unchanged = sum(changed not in pair for pair in moved)
    share_before = before.get(changed, 0.0) / sum(before.values())
    share_after = after[changed] / sum(after.values())
    return {
        "moved_pct": 100 * len(moved) / count,
        "must_pct": 100 * abs(share_after - share_before),
        "between_unchanged_pct": 100 * between_unchanged / count,
    }


async def measure(arguments: argparse.Namespace) -> Figures:
    return {
        "cost": {
            f"{n}, {case}": await cost(
                n, case, arguments.requests, arguments.concurrency, arguments.passes
            )
            for n in arguments.replicas
            for case in CASES
        },
        "movement": {change: await movement(change, arguments.keys) for change in CHANGES},
    }


def run_in(checkout: Path, arguments: argparse.Namespace) -> Figures:
    """One round in ``checkout``, by its own interpreter and its own code."""
    command = [
        str(checkout / ".venv" / "bin" / "python"),
        str(HERE / "keyed_routing.py"),
        "--round-only",
        "--replicas",
        *map(str, arguments.replicas),
        "--requests",
        str(arguments.requests),
        "--concurrency",
        str(arguments.concurrency),
        "--passes",
        str(arguments.passes),
        "--keys",
        str(arguments.keys),
    ]
    done = subprocess.run(
        command,
        cwd=checkout,
        env=os.environ | {"PYTHONPATH": str(checkout)},
        check=True,
        capture_output=True,
        text=True,
    )
    figures: Figures = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _commit(checkout: Path) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True
    )
    return done.stdout.strip() or "?"


def report(rounds: dict[Path, list[Figures]], replicas: list[int]) -> None:
    names = {checkout: f"{checkout.name}@{_commit(checkout)}" for checkout in rounds}

    def med(checkout: Path, section: str, row: str, column: str) -> float:
        return statistics.median(r[section][row][column] for r in rounds[checkout])

    checkouts = list(rounds)
    print("\nRouter.acquire per keyed request, microseconds (medians over rounds)")
    for row in (f"{n}, {case}" for n in replicas for case in CASES):
        cells = []
        for checkout in checkouts:
            p50 = med(checkout, "cost", row, "p50_us")
            p99 = med(checkout, "cost", row, "p99_us")
            cells.append(f"{names[checkout]} p50 {p50:6.1f} p99 {p99:6.1f}")
        if len(checkouts) == 2:
            ratio = med(checkouts[1], "cost", row, "p50_us") / med(
                checkouts[0], "cost", row, "p50_us"
            )
            cells.append(f"p50 ratio {ratio:.2f}")
        count, case = row.split(", ")
        print(f"  {count:>3s} replicas, {case:8s}: " + " | ".join(cells))
    print("\nKeys that changed replica, percent of all keys")
    for change in CHANGES:
        for checkout in checkouts:
            moved = med(checkout, "movement", change, "moved_pct")
            must = med(checkout, "movement", change, "must_pct")
            between = med(checkout, "movement", change, "between_unchanged_pct")
            print(
                f"  {change:13s} {names[checkout]}: moved {moved:5.1f} (must {must:4.1f}),"
                f" between unchanged replicas {between:5.1f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 10, 64])
    parser.add_argument("--requests", type=int, default=2000, help="per pass")
    parser.add_argument("--concurrency", type=int, default=12, help="leases held open")
    parser.add_argument("--passes", type=int, default=9)
    parser.add_argument("--keys", type=int, default=100_000, help="keys routed per change")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout, run in turn")
    parser.add_argument("--round-only", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if min(arguments.replicas) < 1 or arguments.requests < 4 or arguments.keys < 1:
        parser.error("--replicas at least 1, --requests at least 4, --keys at least 1")
    if arguments.round_only:
        print(json.dumps(asyncio.run(measure(arguments))))
        return
    checkouts = [HERE.parent]
    if arguments.baseline is not None:
        checkouts.insert(0, arguments.baseline.resolve())
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    rounds: dict[Path, list[Figures]] = {c: [] for c in checkouts}
    for number in range(1, arguments.rounds + 1):
        for checkout in checkouts:
            rounds[checkout].append(run_in(checkout, arguments))
            print(f"round {number}, {checkout} done", flush=True)
    report(rounds, arguments.replicas)
    print(f"\nload average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
