"""What every ``llmgw-server`` command shares: the database URL flag, the engine networks
flag, and failing in one line."""

from __future__ import annotations

import sys
from typing import Annotated

from cyclopts import Parameter

from app.domain.egress import EngineNetworks

DatabaseUrl = Annotated[
    str,
    Parameter(
        env_var="LLMGW_DATABASE_URL",
        help="PostgreSQL URL, e.g. postgresql://llmgw@db:5432/llmgw.",
    ),
]


EngineNetworksFlag = Annotated[
    str,
    Parameter(
        env_var="LLMGW_ENGINE_NETWORKS",
        help="where engines may live, comma-separated: networks (10.20.0.0/16), addresses, "
        "DNS names (gpu-07.internal) or *.domain; the gateway contacts no engine elsewhere. "
        "[default: only the address each node's agent connects from, and loopback if it "
        "connects over loopback]",
        show_default=False,
    ),
]


def engine_networks_of(text: str) -> EngineNetworks | None:
    """The ``--engine-networks`` value, or None for the default when it is not given.
    Raises ``InvalidEngineNetworks`` (its message names the flag) for a bad list."""
    if not text.strip():
        return None
    return EngineNetworks.parse(text)


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)
