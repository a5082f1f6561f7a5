"""What ``llmgw-dev`` asks of the admin API, through llmgw-cli's own client: whether the
server leads, which nodes are connected, the demo model, its serving replicas, and the
API key it prints.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path

from cli.client import AdminClient
from cli.key_requests import create_key, list_keys, revoke_key
from cli.operator import get_model, get_nodes, get_replicas, put_model
from cli.readiness import readiness
from cli.views import ModelSpecView
from devcluster.state_files import read_state_file


def leads(admin: AdminClient) -> bool:
    """Whether the server at the admin URL leads and takes this cluster's token. Another
    llmgw server that bound the port after dev checked it answers ``/readyz`` as well; it
    refuses the token (``AuthenticationRequired``), so it is not taken for this one."""
    answer = readiness(admin)
    if not (answer.ready and answer.role == "leader"):
        return False
    get_nodes(admin)
    return True


def nodes_connected(admin: AdminClient, nodes: Collection[str]) -> bool:
    connected = {node.id for node in get_nodes(admin).value if node.connected}
    return set(nodes) <= connected


def declared_spec(admin: AdminClient, name: str) -> ModelSpecView | None:
    """The spec the log holds for the model ``name``; None when it is not declared."""
    existing = get_model(admin, name)
    if existing is None or existing.value.removed:
        return None
    return existing.value.spec


def declare_model(admin: AdminClient, spec: Mapping[str, object]) -> int:
    """Declare the model of ``spec`` unless the log already has it; its desired replica
    count (the log's, when it has the model: a count scaled meanwhile is kept)."""
    name = str(spec["name"])
    existing = get_model(admin, name)
    if existing is not None:
        return existing.value.desired
    return put_model(admin, spec).value.model.desired


def why_short(admin: AdminClient, model: str) -> list[str]:
    """Why the model is below its count, in the server's words; empty when it is not."""
    existing = get_model(admin, model)
    return [] if existing is None else list(existing.value.below_desired_because)


def serving(admin: AdminClient, model: str) -> list[str]:
    """The ids of the model's serving replicas, sorted."""
    replicas = get_replicas(admin, model=model, phase="serving").value
    return sorted(replica.id for replica in replicas)


def api_key(admin: AdminClient, path: Path, *, name: str, models: list[str]) -> str:
    """The API key stored at ``path`` (mode 0600) while it is live; else a new one for
    ``models``, created through the admin API (a live key of the same name, whose secret
    was lost with the file, is revoked first)."""
    keys = [key.view for key in list_keys(admin)]
    live = {key.prefix: key for key in keys if not key.revoked}
    stored = (read_state_file(path) or "").strip()
    if stored and _prefix(stored) in live:
        return stored
    for key in live.values():
        if key.name == name:
            revoke_key(admin, key.prefix)
    created = create_key(admin, name, models).reply.value.key
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(created + "\n")
    return created


def _prefix(key: str) -> str | None:
    """The public prefix of an ``llmgw-<prefix>-<secret>`` key (the secret may hold '-')."""
    parts = key.split("-", 2)
    return parts[1] if len(parts) == 3 and parts[0] == "llmgw" else None
