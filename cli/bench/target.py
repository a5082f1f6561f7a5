"""The engine under test: where it listens, which model, which API, and how a replica id
becomes that address through the admin API.

Bench talks to the engine directly, never through the gateway, so that admission does not
shape what is measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import msgspec

from cli.arguments import segment
from cli.bench.errors import TargetRefused
from cli.client import UNREADABLE, AdminClient, ApiProblem

Api = Literal["completions", "chat"]
SERVING_PHASES = ("serving", "draining")
_T = TypeVar("_T")


@dataclass(frozen=True)
class Engine:
    root_url: str
    """The engine's own root, e.g. ``http://10.0.0.7:8001``: /metrics lives here."""
    model: str
    """The model id the engine serves, as requests name it."""
    api: Api = "completions"
    ignore_eos: bool = True
    """Whether requests carry ``ignore_eos`` (the engine refused it when false)."""

    @property
    def api_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def generation_url(self) -> str:
        path = "chat/completions" if self.api == "chat" else "completions"
        return f"{self.api_url}/{path}"

    @property
    def metrics_url(self) -> str:
        return f"{self.root_url}/metrics"


class _Shard(msgspec.Struct, frozen=True):
    index: int
    node_id: str
    port: int


class _Replica(msgspec.Struct, frozen=True):
    """``GET /admin/v1/replicas/{id}``, the fields bench uses."""

    id: str
    model: str
    phase: str
    shards: list[_Shard]
    revision: int | None = None


class _Connection(msgspec.Struct, frozen=True):
    address: str


class _Node(msgspec.Struct, frozen=True):
    """``GET /admin/v1/nodes/{id}``, the fields bench uses."""

    connection: _Connection


@dataclass(frozen=True)
class Target:
    """The engine to bench, and what the admin API calls it."""

    root_url: str
    replica_id: str | None = None
    model: str | None = None
    """The llmgw model the replica belongs to (known for a replica only)."""
    revision: int | None = None
    """The model's revision the replica runs (known for a replica only): ``--apply`` sends
    it, so the model's settings are not replaced if it moved to another meanwhile."""


def engine_root(url: str) -> str:
    """The root of an OpenAI-compatible base URL: ``http://h:8000/v1/`` and
    ``http://h:8000`` are both ``http://h:8000``. Raises ``ValueError``."""
    expected = "expected http://HOST:PORT or an OpenAI base URL ending in /v1"
    try:
        parts = urlsplit(url.strip())
        # Read only to be checked: a port of letters or over 65535 is no port, and was
        # found only by the first request, as an engine that "did not answer" (exit 1).
        parts.port  # noqa: B018
    except ValueError as exc:
        raise ValueError(f"--url {url!r}: {exc}; {expected}") from exc
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--url {url!r}: {expected}")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def resolve_replica(client: AdminClient, replica_id: str) -> Target:
    """Where the replica's engine listens: its first shard's node address and port, as
    the gateway routes to it. Raises ``cli.client.ClientError`` and ``TargetRefused``."""
    replica = _get(client, f"/admin/v1/replicas/{segment(replica_id, 'the replica id')}", _Replica)
    if replica.phase not in SERVING_PHASES:
        raise TargetRefused(
            f"replica {replica_id} is {replica.phase}, not serving: bench measures a replica "
            "that serves (see `llmgw-cli history replica " + replica_id + "`)"
        )
    first = min(replica.shards, key=lambda shard: shard.index, default=None)
    if first is None:
        raise TargetRefused(f"replica {replica_id} has no shards to measure")
    node = _get(client, f"/admin/v1/nodes/{segment(first.node_id, 'the node id')}", _Node)
    address = node.connection.address
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return Target(
        root_url=f"http://{host}:{first.port}",
        replica_id=replica.id,
        model=replica.model,
        revision=replica.revision,
    )


def left_service(client: AdminClient, replica_id: str) -> str | None:
    """Why a replica whose engine failed bench mid-run no longer serves, when it does not:
    llmgw stopped it (a scale-down, a drain, a rollout) and the engine went with it, which
    no message about the engine or the network would tell. None while it still serves.
    Raises ``cli.client.ClientError``."""
    path = f"/admin/v1/replicas/{segment(replica_id, 'the replica id')}"
    phase = _get(client, path, _Replica).phase
    if phase in SERVING_PHASES:
        return None
    return (
        f"replica {replica_id} stopped serving while bench ran: it is {phase} now "
        f"(see `llmgw-cli history replica {replica_id}`)"
    )


def _get(client: AdminClient, path: str, kind: type[_T]) -> _T:
    body = client.request("GET", path)
    try:
        return msgspec.json.decode(body, type=kind)
    except UNREADABLE as exc:
        raise ApiProblem(
            200, f"the admin API sent an answer to {path} bench cannot read: {exc}"
        ) from exc
