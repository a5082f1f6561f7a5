"""Ports: free ones for listeners, and engine port ranges that no other cluster uses.

Listeners (admin API, agent hub, gateway) take a free loopback port (``free_port``), or a
given one checked with ``port_is_free``. Engines need ranges, one per node (agents are
told ``--port-range``), and two clusters on one machine must never share one.

``llmgw-dev`` keeps a block of its own per state directory: the agents of one dev cluster
give their engines ports from one block of ``BLOCK_PORTS`` ports (``NODE_PORTS`` per
node), so two dev clusters on one machine never place engines on the same ports. The
block is kept in the state directory (``engine-ports``): the next run gives its agents the
same ranges, and the engines a killed run left behind are adopted where they listen.

While dev runs it holds the block's claim: an abstract Unix socket named after it, which
no other process on this machine (of any user) can bind meanwhile, and which the kernel
releases however dev ends. A state directory without a block takes the first one that no
running dev claims and on which nothing listens, looking first where the state directory's
path points (a hash of it), not at the lowest block: a block is claimed only while its dev
runs, so a dev cluster stopped and started again would otherwise find its block taken by
whichever new state directory started in between, and its agents on other ports than its
replicas were placed on.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import socket
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.errors import EnginePortsUnavailable
from devcluster.state_files import read_state_file

LOOPBACK = "127.0.0.1"

FIRST_PORT = 21000
LAST_PORT = 30999
"""Below the ephemeral ports Linux hands out for connections (32768 and up)."""
NODE_PORTS = 100
BLOCK_PORTS = 2 * NODE_PORTS
BLOCK_FILE = "engine-ports"
CLAIM_PREFIX = "llmgw-dev-engine-ports-"


def free_port() -> int:
    """A port nothing listens on now (the kernel's choice); a race with another process
    that takes it before it is bound is possible but rare."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    # SO_REUSEADDR as servers set it: connections in TIME_WAIT do not block a restart.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def listens(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


@dataclass(eq=False)
class EnginePortBlock:
    first: int
    _claim: socket.socket
    moved_from: int | None = None
    """The block the state directory had recorded, when another running dev held it."""

    def node_range(self, index: int) -> tuple[int, int]:
        """The engine ports of the ``index``-th node, both ends included."""
        if not 0 <= index < BLOCK_PORTS // NODE_PORTS:
            raise ValueError(f"a block holds {BLOCK_PORTS // NODE_PORTS} nodes, not {index + 1}")
        low = self.first + index * NODE_PORTS
        return low, low + NODE_PORTS - 1

    def release(self) -> None:
        self._claim.close()


def claim_engine_ports(state_dir: Path) -> EnginePortBlock:
    """The state directory's block, claimed; a new one the first time (or when another
    running dev holds the recorded one)."""
    path = state_dir / BLOCK_FILE
    recorded = _recorded(path)
    if recorded is not None:
        claim = _claim(recorded)
        if claim is not None:
            # No check that its ports are free: engines of an earlier run may listen there.
            return EnginePortBlock(recorded, claim)
    for first in _blocks_from(home_block(state_dir)):
        claim = _claim(first)
        if claim is None:
            continue
        if all(port_is_free(port) for port in range(first, first + BLOCK_PORTS)):
            path.write_text(f"{first}\n")
            return EnginePortBlock(first, claim, moved_from=recorded)
        claim.close()
    raise EnginePortsUnavailable(
        f"every block of {BLOCK_PORTS} engine ports in {FIRST_PORT}-{LAST_PORT} is claimed "
        "by another running `llmgw-dev` or has a port in use"
    )


def home_block(state_dir: Path) -> int:
    """Where a new state directory looks for a block first: one of the blocks, picked by
    its path, so that two state directories rarely look at the same block first."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).digest()
    blocks = (LAST_PORT + 1 - FIRST_PORT) // BLOCK_PORTS
    return FIRST_PORT + int.from_bytes(digest[:8], "big") % blocks * BLOCK_PORTS


def _blocks_from(home: int) -> list[int]:
    """Every block's first port, ``home`` first, then the ones after it, wrapping round."""
    blocks = list(range(FIRST_PORT, LAST_PORT + 1 - BLOCK_PORTS + 1, BLOCK_PORTS))
    at = blocks.index(home)
    return blocks[at:] + blocks[:at]


def _recorded(path: Path) -> int | None:
    try:
        first = int(read_state_file(path) or "")
    except ValueError:
        return None
    aligned = (first - FIRST_PORT) % BLOCK_PORTS == 0
    return first if aligned and FIRST_PORT <= first <= LAST_PORT + 1 - BLOCK_PORTS else None


def _claim(first: int) -> socket.socket | None:
    return claim_name(f"{CLAIM_PREFIX}{first}")


def claim_name(name: str) -> socket.socket | None:
    """An abstract Unix socket bound to ``name``: held by this process alone until it is
    closed or the process ends, however it ends; None when another process holds it."""
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0{name}")
    except OSError:
        with contextlib.suppress(OSError):
            claim.close()
        return None
    return claim


TEST_RANGE_PORTS = 20
TEST_PORTS_FROM = (10000, 30000)
"""Below the ephemeral ports. A test cluster's engines find out at readiness when another
process holds their port (the agent checks who listens), so a random base is enough."""


@dataclass(eq=False)
class NodePortRanges:
    """Engine port ranges for the nodes of a short-lived cluster (tests, benchmarks): each
    node gets ``TEST_RANGE_PORTS`` ports at a random base of its own, the same for every
    agent it runs."""

    rng: random.Random = field(default_factory=random.Random)
    ranges: dict[str, str] = field(default_factory=dict)

    def of(self, node_id: str) -> str:
        """The node's range as ``--port-range`` takes it, ``LO-HI``."""
        if node_id not in self.ranges:
            low, high = TEST_PORTS_FROM
            taken = {int(taken.split("-")[0]) for taken in self.ranges.values()}
            base = self.rng.randrange(low, high, TEST_RANGE_PORTS)
            while base in taken:
                base = self.rng.randrange(low, high, TEST_RANGE_PORTS)
            self.ranges[node_id] = f"{base}-{base + TEST_RANGE_PORTS - 1}"
        return self.ranges[node_id]
