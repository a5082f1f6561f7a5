"""Which connection speaks for a node, when agents reconnect and old sockets close late."""

from __future__ import annotations

from app.hub.registry import ConnectionRegistry
from app.hub.session import AgentSession, Close, PeerCertificate, SessionState
from wire.messages import PROTOCOL_VERSION, CloseCode, Hello, encode


class Connection:
    """Stands in for the shell's per-connection handle; only its identity matters."""

    def __init__(self, name: str) -> None:
        self.name = name


def test_a_registered_connection_is_the_nodes_connection() -> None:
    registry: ConnectionRegistry[Connection] = ConnectionRegistry()
    first = Connection("first")

    assert registry.register("gpu-1", first) is None
    assert registry.get("gpu-1") is first
    assert registry.get("gpu-2") is None
    assert registry.connected_nodes() == ["gpu-1"]


def test_a_second_connection_replaces_the_first_and_hands_it_back() -> None:
    registry: ConnectionRegistry[Connection] = ConnectionRegistry()
    first, second = Connection("first"), Connection("second")
    registry.register("gpu-1", first)

    assert registry.register("gpu-1", second) is first
    assert registry.get("gpu-1") is second
    assert len(registry) == 1


def test_a_late_close_of_the_replaced_connection_leaves_the_new_one() -> None:
    registry: ConnectionRegistry[Connection] = ConnectionRegistry()
    first, second = Connection("first"), Connection("second")
    registry.register("gpu-1", first)
    registry.register("gpu-1", second)

    assert registry.unregister("gpu-1", first) is False
    assert registry.get("gpu-1") is second

    assert registry.unregister("gpu-1", second) is True
    assert registry.get("gpu-1") is None
    assert registry.connected_nodes() == []


def test_registering_the_same_connection_again_replaces_nothing() -> None:
    registry: ConnectionRegistry[Connection] = ConnectionRegistry()
    first = Connection("first")
    registry.register("gpu-1", first)
    assert registry.register("gpu-1", first) is None


def test_nodes_are_listed_in_order() -> None:
    registry: ConnectionRegistry[Connection] = ConnectionRegistry()
    for node_id in ("gpu-3", "gpu-1", "gpu-2"):
        registry.register(node_id, Connection(node_id))
    assert registry.connected_nodes() == ["gpu-1", "gpu-2", "gpu-3"]


def test_an_agent_that_reconnects_keeps_the_node_connected() -> None:
    """The story end to end: an agent redials before the old socket died; the old session
    is closed as replaced, and its late end neither reports the node gone nor unregisters
    the new connection."""
    registry: ConnectionRegistry[AgentSession] = ConnectionRegistry()
    old, new = _session(now=0.0), _session(now=30.0)
    old.receive(encode(_hello()), now=0.0)
    registry.register("gpu-1", old)

    new.receive(encode(_hello()), now=30.0)
    previous = registry.register("gpu-1", new)
    assert previous is old
    assert previous.replaced() == [Close(CloseCode.REPLACED, "replaced by a newer connection")]

    assert old.connection_lost("closed: replaced", now=31.0) == []
    assert registry.unregister("gpu-1", old) is False
    assert registry.get("gpu-1") is new
    assert new.state is SessionState.ACTIVE


def _session(now: float) -> AgentSession:
    return AgentSession(
        peer=PeerCertificate(common_name="gpu-1", subject="CN=gpu-1", kind="node"),
        remote_address="127.0.0.7:5000",
        require_identity=True,
        heartbeat_interval_s=5.0,
        heartbeat_timeout_s=15.0,
        server_id="cp-a",
        epoch=1,
        now=now,
    )


def _hello() -> Hello:
    return Hello(
        protocol_version=PROTOCOL_VERSION,
        node_id="gpu-1",
        agent_version="0.1.0",
        address="127.0.0.7",
        port_range=(20000, 20999),
    )
