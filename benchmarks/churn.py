"""Churn: what a running cluster keeps of things that come and go, measured on its processes.

    python benchmarks/churn.py --state-dir /tmp/dev --admin-url http://127.0.0.1:9081 \
        --gateway-url http://127.0.0.1:9080 [--keys 800] [--requests 3000] [--models 16] \
        [--idle 180]

Against a cluster already running (``llmgw-dev``: its state directory holds the admin
token and an API key for the ``demo`` model, and its PostgreSQL's socket), it churns, one
phase after another:

- **keys**: ``--keys`` API keys, each with an rpm and a tpm limit, used twice (once read
  whole, once left after the stream's first bytes) and revoked;
- **requests**: ``--requests`` requests with the dev key, each on a new connection, each
  with a session key, ``prompt_cache_key`` and ``user`` of its own, a third of them left
  mid-stream;
- **models**: ``--models`` models of one replica each (the engine simulator), declared,
  served, sent three requests, removed;

then waits ``--idle`` seconds. Before and after each phase and after the wait it samples
every process of the cluster (``llmgw-server``, ``llmgw-agent``: RSS and open fds, from
/proc), the rows of ``rate_budgets`` and ``gateway_reports``, and the lines of gateway
series on the admin listener's ``/metrics``. Growth that the wait does not take back and
that more churn makes larger is a leak; docs/performance.md ("Churn") has a run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import httpx

# Run as a script, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import format_table

SIMULATOR = (
    f"{Path(sys.executable).parent / 'llmgw-sim-engine'} --port {{port}} --model {{model}} "
    "--max-num-seqs 16 --decode-base-ms 5"
)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, required=True, help="the dev cluster's")
    parser.add_argument("--admin-url", required=True)
    parser.add_argument("--gateway-url", required=True, help="without /v1")
    parser.add_argument("--keys", type=int, default=800)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--idle", type=float, default=180.0, help="seconds, after the churn")
    return parser.parse_args()


class Cluster:
    def __init__(self, arguments: argparse.Namespace) -> None:
        state = arguments.state_dir
        self.state = state
        token = (state / "admin-token").read_text().strip()
        self.admin = httpx.Client(
            base_url=arguments.admin_url, headers={"authorization": f"Bearer {token}"}, timeout=30
        )
        self.gateway_url = arguments.gateway_url
        self.dev_key = (state / "api-key").read_text().strip()
        postgres = state / "postgres"
        self.database = dict(
            host=str(postgres / "socket"),
            port=int((postgres / "port").read_text()),
            user="postgres",
            database="llmgw",
        )

    def processes(self) -> dict[str, int]:
        """Each process of the cluster by a name, its pid."""
        found: dict[str, int] = {}
        listing = subprocess.run(["pgrep", "-af", "llmgw-(server|agent)"], capture_output=True)
        for line in listing.stdout.decode().splitlines():
            pid, _, command = line.partition(" ")
            if str(self.state) not in command:
                continue
            words = command.split()
            if "--node-id" in words:
                found["agent " + words[words.index("--node-id") + 1]] = int(pid)
            elif "serve" in words:
                found["server"] = int(pid)
        return found

    async def sample(self, label: str) -> list[str]:
        row = [label]
        db = await asyncpg.connect(**self.database)
        try:
            for table in ("rate_budgets", "gateway_reports"):
                row.append(str(await db.fetchval(f"SELECT count(*) FROM {table}")))
        finally:
            await db.close()
        page = self.admin.get("/metrics").text
        row.append(str(sum(line.startswith("llmgw_gateway") for line in page.splitlines())))
        for name, pid in sorted(self.processes().items()):
            row.append(f"{name} {_rss_mib(pid):.0f} MiB {len(os.listdir(f'/proc/{pid}/fd'))} fd")
        return row


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _ask(gateway_url: str, key: str, model: str, *, leave: bool) -> int:
    """One request on a connection of its own, keyed apart from every other; ``leave``:
    streamed, and left after its first bytes."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"hi {uuid.uuid4()}"}],
        "max_tokens": 8,
        "user": f"u-{uuid.uuid4()}",
        "prompt_cache_key": f"p-{uuid.uuid4()}",
        "stream": leave,
    }
    headers = {"authorization": f"Bearer {key}", "x-session-id": f"s-{uuid.uuid4()}"}
    async with httpx.AsyncClient(base_url=gateway_url, timeout=30) as client:
        if not leave:
            return (
                await client.post("/v1/chat/completions", json=body, headers=headers)
            ).status_code
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers=headers
        ) as answer:
            async for _ in answer.aiter_bytes():
                break
            return answer.status_code


async def churn_keys(cluster: Cluster, count: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    for _ in range(count):
        created = cluster.admin.post(
            "/admin/v1/keys",
            json={"name": f"churn-{uuid.uuid4().hex[:12]}", "models": ["demo"], "rpm": 100_000,
                  "tpm": 10_000_000},
        )  # fmt: skip
        created.raise_for_status()
        key = created.json()
        for leave in (False, True):
            status = await _ask(cluster.gateway_url, key["key"], "demo", leave=leave)
            statuses[status] = statuses.get(status, 0) + 1
        cluster.admin.delete(f"/admin/v1/keys/{key['prefix']}").raise_for_status()
    return statuses


async def churn_requests(cluster: Cluster, count: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    for first in range(0, count, 8):
        answers = await asyncio.gather(
            *(
                _ask(cluster.gateway_url, cluster.dev_key, "demo", leave=n % 3 == 0)
                for n in range(first, min(count, first + 8))
            )
        )
        for status in answers:
            statuses[status] = statuses.get(status, 0) + 1
    return statuses


async def churn_models(cluster: Cluster, count: int) -> dict[int, int]:
    created = cluster.admin.post(
        "/admin/v1/keys", json={"name": f"churn-{uuid.uuid4().hex[:12]}", "models": ["*"]}
    )
    created.raise_for_status()
    key = created.json()
    statuses: dict[int, int] = {}
    for _ in range(count):
        name = f"churn-{uuid.uuid4().hex[:8]}"
        spec = {"command": SIMULATOR, "engine": "vllm", "gpus_per_shard": 1, "replicas": 1}
        cluster.admin.put(f"/admin/v1/models/{name}", json=spec).raise_for_status()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if cluster.admin.get(f"/admin/v1/models/{name}").json().get("serving") == 1:
                break
            await asyncio.sleep(0.5)
        for _ in range(3):
            status = 0
            for _ in range(40):  # until the gateway routes to it
                status = await _ask(cluster.gateway_url, key["key"], name, leave=False)
                if status == 200:
                    break
                await asyncio.sleep(0.25)
            statuses[status] = statuses.get(status, 0) + 1
        cluster.admin.delete(f"/admin/v1/models/{name}").raise_for_status()
    cluster.admin.delete(f"/admin/v1/keys/{key['prefix']}").raise_for_status()
    return statuses


async def main() -> None:
    arguments = _arguments()
    cluster = Cluster(arguments)
    rows = [await cluster.sample("before")]
    phases = (
        ("keys", churn_keys, arguments.keys),
        ("requests", churn_requests, arguments.requests),
        ("models", churn_models, arguments.models),
    )
    for phase, churn, count in phases:
        if count <= 0:
            continue
        started = time.monotonic()
        statuses = await churn(cluster, count)
        took = time.monotonic() - started
        rows.append(await cluster.sample(f"{count} {phase}, {took:.0f} s, {statuses}"))
    await asyncio.sleep(arguments.idle)
    rows.append(await cluster.sample(f"after {arguments.idle:.0f} s idle"))
    width = max(len(row) for row in rows)
    headers = ["after", "rate_budgets", "gateway_reports", "gateway series"]
    headers += [f"process {n}" for n in range(1, width - len(headers) + 1)]
    print(format_table(headers, [row + [""] * (width - len(row)) for row in rows]))


if __name__ == "__main__":
    asyncio.run(main())
