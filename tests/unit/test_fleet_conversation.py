"""Both ends of the agent channel talking through encode/decode, with no socket between
them: what one side sends is exactly what the other side receives."""

from __future__ import annotations

from agent import session as agent_side
from agent.session import CommandLedger, Execute, HeartbeatContent, ServerSession
from app.hub import session as server_side
from app.hub.session import (
    AgentGone,
    AgentHeartbeat,
    AgentHello,
    AgentSession,
    CommandCompleted,
    Observation,
    PeerCertificate,
    ShardStatusReported,
)
from wire.messages import (
    PROTOCOL_VERSION,
    CloseCode,
    CommandResult,
    HeartbeatShard,
    Hello,
    ShardStatus,
    StartShard,
    encode,
)

HELLO = Hello(
    protocol_version=PROTOCOL_VERSION,
    node_id="gpu-1",
    agent_version="0.1.0",
    address="127.0.0.7",
    port_range=(20000, 20999),
)
START = StartShard(
    command_id="c-1",
    replica_id="llama-1",
    shard_index=0,
    model="llama",
    argv=("vllm", "serve", "llama"),
    gpus=(0,),
    port=20001,
)
RUNNING = HeartbeatContent(
    shards=(HeartbeatShard(replica_id="llama-1", shard_index=0, state="ready"),)
)


class Link:
    """Carries each side's Send outputs to the other side as encoded bytes."""

    def __init__(self, agent: ServerSession, server: AgentSession) -> None:
        self.agent = agent
        self.server = server
        self.observed: list[Observation] = []
        self.executed: list[Execute] = []
        self.closes: list[tuple[str, CloseCode, str]] = []

    def from_agent(self, outputs: list[agent_side.Output], now: float) -> None:
        for output in outputs:
            match output:
                case agent_side.Send(message=message):
                    self.from_server(self.server.receive(encode(message), now), now)
                case agent_side.Execute():
                    self.executed.append(output)
                case agent_side.Close(code=code, reason=reason):
                    self.closes.append(("agent", code, reason))

    def from_server(self, outputs: list[server_side.Output], now: float) -> None:
        for output in outputs:
            match output:
                case server_side.Send(message=message):
                    self.from_agent(self.agent.receive(encode(message), now), now)
                case server_side.Observe(observation=observation):
                    self.observed.append(observation)
                case server_side.Close(code=code, reason=reason):
                    self.closes.append(("server", code, reason))


def connect(now: float, commands: CommandLedger | None = None) -> Link:
    agent = ServerSession(
        node_id="gpu-1",
        hello_factory=lambda: HELLO,
        now=now,
        heartbeat_content=lambda: RUNNING,
        commands=commands,
    )
    server = AgentSession(
        peer=PeerCertificate(common_name="gpu-1", subject="CN=gpu-1,O=llmgw", kind="node"),
        remote_address="127.0.0.7:40000",
        require_identity=True,
        heartbeat_interval_s=1.0,
        heartbeat_timeout_s=3.0,
        server_id="cp-a",
        epoch=7,
        now=now,
    )
    link = Link(agent, server)
    link.from_agent(agent.opened(now), now)
    return link


def test_an_agent_connects_runs_a_command_and_stays_connected() -> None:
    link = connect(now=0.0)
    assert link.observed == [
        AgentHello(node_id="gpu-1", hello=HELLO, remote_address="127.0.0.7:40000")
    ]
    assert link.agent.welcome is not None
    assert link.agent.welcome.epoch == 7

    link.from_server(link.server.send_command(START), now=0.5)
    assert link.executed == [Execute(START)]
    ready = ShardStatus(
        replica_id="llama-1", shard_index=0, state="ready", pid=4242, port=20001, command_id="c-1"
    )
    link.from_agent(link.agent.report_shard(ready), now=2.0)
    link.from_agent(link.agent.command_finished("c-1", ok=True), now=2.0)

    for tenth in range(5, 600):
        now = tenth / 10
        link.from_agent(link.agent.tick(now), now)
        link.from_server(link.server.tick(now), now)

    assert link.closes == []
    assert ShardStatusReported(node_id="gpu-1", status=ready) in link.observed
    answered = CommandResult(command_id="c-1", ok=True)
    assert CommandCompleted(node_id="gpu-1", result=answered, sent=True) in link.observed
    heartbeats = [o for o in link.observed if isinstance(o, AgentHeartbeat)]
    assert [h.heartbeat.seq for h in heartbeats] == list(range(59))
    assert all(h.heartbeat.shards == RUNNING.shards for h in heartbeats)


def test_an_agent_that_stops_talking_is_gone_and_the_agent_leaves_a_server_that_does() -> None:
    link = connect(now=0.0)

    link.from_server(link.server.tick(now=3.5), now=3.5)
    link.from_agent(link.agent.tick(now=3.5), now=3.5)

    assert link.closes == [
        ("server", CloseCode.TIMED_OUT, "no heartbeat for 3.5s"),
        ("agent", CloseCode.TIMED_OUT, "nothing from the server for 3.5s"),
    ]
    assert link.observed[-1] == AgentGone(node_id="gpu-1", reason="no heartbeat for 3.5s")


def test_a_command_resent_after_a_reconnect_is_answered_not_rerun() -> None:
    ledger = CommandLedger()
    first = connect(now=0.0, commands=ledger)
    first.from_server(first.server.send_command(START), now=0.5)
    first.agent.connection_lost()
    first.server.connection_lost("connection reset", now=0.6)
    first.agent.command_finished("c-1", ok=True)

    second = connect(now=5.0, commands=ledger)
    second.from_server(second.server.send_command(START), now=5.5)

    assert first.executed == [Execute(START)]
    assert second.executed == []
    assert second.observed[-1] == CommandCompleted(
        node_id="gpu-1", result=CommandResult(command_id="c-1", ok=True), sent=True
    )
