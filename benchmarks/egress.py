"""What the engine trust checks cost, each beside what its caller already pays.

    python benchmarks/egress.py [--routes 4000] [--repeat 15]

1. The gateway's egress check, on a routing table of ``--routes`` routes over 1,000 nodes
   (``app.gateway.egress``), against building that snapshot from its rows, which every
   read of the routing table already costs: the check of a table seen for the first time
   (every route judged), of the same table again (decisions reused), with a list of engine
   networks and with the default (each route's own agent address), and with a quarter of
   the routes refused.
2. The agent's port ownership check (``agent.engines.port_owner``) of a server listening
   in this process, against the readiness requests it follows (``GET /health`` and
   ``GET /v1/models`` over loopback). It reads every process's ``/proc/<pid>/stat``, so its
   cost grows with the machine's process count, which is reported.

Medians of ``--repeat`` runs, in milliseconds. Results are printed and written to
``benchmarks/results/egress-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import http.server
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.engines.port_owner import Owned, check_port_owner
from app.domain.egress import EngineNetworks
from app.gateway.egress import EngineEgress
from app.gateway.metrics import GatewayMetrics
from app.gateway.snapshot import build_snapshot
from app.gateway.table import GatewaySnapshot
from app.logs import configure_logging
from app.store.routing_rows import RouteRow
from benchmarks.common import format_table, load_average, write_results

NODES = 1_000
MODELS = 50
ALLOWED = "127.1.0.0/17"
"""Holds the allowed nodes' addresses (127.1.0.1 onwards, 250 to a /24), not the refused
ones (127.1.130.1 onwards)."""


class Figure(msgspec.Struct, frozen=True):
    name: str
    median_ms: float
    p90_ms: float
    ratio: float | None
    """Median over the baseline's median."""


class Results(msgspec.Struct, frozen=True):
    routes: int
    repeat: int
    processes: int
    load_average: tuple[float, float, float]
    figures: list[Figure]


def route_rows(count: int, refused_share: float) -> list[RouteRow]:
    """``count`` routes spread over ``NODES`` nodes; nodes past the allowed half of the
    addresses hold ``refused_share`` of them, rounded down."""
    refused_count = int(count * refused_share)
    rows = []
    for r in range(count):
        refused = r < refused_count
        node = NODES // 2 + r % (NODES // 2) if refused else r % (NODES // 2)
        address = f"127.1.{node // 250 + (128 if refused else 0)}.{node % 250 + 1}"
        rows.append(
            RouteRow(
                replica_id=f"model-{r % MODELS}-{r // MODELS + 1}",
                model=f"model-{r % MODELS}",
                address=address,
                port=20_000 + r // NODES,
                weight=1.0,
                target_waiting=5,
                kv_ceiling=0.8,
                draining=False,
                agent_address=f"{address}:51234" if not refused else "127.0.0.1:51234",
            )
        )
    return rows


def interleaved(measures: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Milliseconds per run of each measure, the measures taking turns in every round so
    that a machine busy for a while slows them all alike."""
    samples: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(repeat):
        for name, run in measures.items():
            start = time.perf_counter()
            run()
            samples[name].append((time.perf_counter() - start) * 1000)
    return samples


def figure(name: str, samples: list[float], baseline: float | None) -> Figure:
    ordered = sorted(samples)
    median = statistics.median(ordered)
    return Figure(
        name=name,
        median_ms=round(median, 3),
        p90_ms=round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        ratio=None if baseline is None else round(median / baseline, 3),
    )


def gateway_figures(routes: int, repeat: int) -> list[Figure]:
    rows, some_refused = route_rows(routes, 0.0), route_rows(routes, 0.25)
    networks = EngineNetworks.parse(ALLOWED)
    snapshot = build_snapshot(1, [], rows, [], 0.0)
    mixed = build_snapshot(1, [], some_refused, [], 0.0)

    def first_time(table: GatewaySnapshot, given: EngineNetworks | None) -> Callable[[], object]:
        return lambda: EngineEgress(given, GatewayMetrics()).admit(table)

    def again(table: GatewaySnapshot, given: EngineNetworks | None) -> Callable[[], object]:
        egress = EngineEgress(given, GatewayMetrics())
        egress.admit(table)
        return lambda: egress.admit(table)

    for table, refused in ((snapshot, 0), (mixed, routes // 4)):
        admitted = EngineEgress(networks, GatewayMetrics()).admit(table)
        kept = sum(len(r) for r in admitted.routes.values())
        assert kept == routes - refused, f"expected {routes - refused} routes kept, got {kept}"

    baseline = f"baseline: build a snapshot of {routes} routes"
    samples = interleaved(
        {
            baseline: lambda: build_snapshot(1, [], rows, [], 0.0),
            "egress, new table, engine networks": first_time(snapshot, networks),
            "egress, same table again, engine networks": again(snapshot, networks),
            "egress, new table, default (agent address)": first_time(snapshot, None),
            "egress, same table again, default": again(snapshot, None),
            "egress, new table, a quarter refused": first_time(mixed, networks),
            "egress, same table again, a quarter refused": again(mixed, networks),
        },
        repeat,
    )
    return figures_of(samples, baseline)


def figures_of(samples: dict[str, list[float]], baseline: str) -> list[Figure]:
    base = statistics.median(samples[baseline])
    return [
        figure(name, values, None if name == baseline else base) for name, values in samples.items()
    ]


class _Engine(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"object": "list", "data": []}'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def agent_figures(repeat: int) -> list[Figure]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        assert isinstance(check_port_owner(port, os.getpid()), Owned)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
            client.get("/health")
            baseline = "baseline: readiness requests (/health, /v1/models)"
            samples = interleaved(
                {
                    baseline: lambda: (client.get("/health"), client.get("/v1/models")),
                    "port ownership check": lambda: check_port_owner(port, os.getpid()),
                },
                repeat,
            )
    finally:
        server.shutdown()
        server.server_close()
    return figures_of(samples, baseline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routes", type=int, default=4_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    configure_logging(
        "error", command="benchmarks/egress.py"
    )  # not a warning for every refused address of every run
    figures = gateway_figures(args.routes, args.repeat) + agent_figures(args.repeat)
    processes = sum(1 for entry in os.listdir("/proc") if entry.isdigit())
    rows = [
        [
            f.name,
            f"{f.median_ms:.3f}",
            f"{f.p90_ms:.3f}",
            "-" if f.ratio is None else f"{f.ratio:.2f}",
        ]
        for f in figures
    ]
    print(format_table(["measure", "median ms", "p90 ms", "x baseline"], rows))
    print(f"processes on this machine: {processes}; load average: {load_average()}")
    path = write_results(
        "egress",
        Results(
            routes=args.routes,
            repeat=args.repeat,
            processes=processes,
            load_average=load_average(),
            figures=figures,
        ),
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
