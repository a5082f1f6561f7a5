"""The engine supervisor with real engine processes.

The engine is a small HTTP server written into the test's directory and run with this
interpreter: it serves ``/health`` and ``/v1/models`` on ``$PORT`` after an optional delay
(or answers ``/health`` with another status, as llama.cpp's 503 while loading), or exits
with an error and chosen last words, or ignores SIGTERM, and exits with code 7 on
``POST /crash``. It may serve from a worker it forks (which may start a session of its
own or a process group of its own, ignore SIGTERM, or keep running once its leader is
gone), as engines with worker
processes do. The same script, started by the test rather
than the supervisor, plays another program that already listens on an engine's port.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from agent.engines import (
    EngineError,
    EngineLaunchError,
    EngineSupervisor,
    ShardChange,
    ShardKey,
    ShardRecord,
    ShardSpec,
    ShardState,
)
from agent.engines.logfiles import KEPT_ENDED_SHARDS, KEPT_ENGINE_LOGS, earlier_log
from agent.engines.readiness import Liveness
from agent.engines.recorded_stop import stop_recorded_engines
from agent.engines.records import (
    RecordStore,
    is_running,
    is_same_process,
    process_identity,
    read_proc_stat,
)
from agent.engines.supervisor import AWAY_ERROR
from tests.support.failing_disk import FailingDisk
from tests.support.ports import free_port
from tests.support.waiting import wait_until

ENGINE_SOURCE = r"""
import argparse, http.server, json, os, signal, sys, threading, time

parser = argparse.ArgumentParser()
parser.add_argument("--delay", type=float, default=0.0)
parser.add_argument("--fail-with", type=int)
parser.add_argument("--last-words", default="fatal: not enough memory for the KV cache")
parser.add_argument("--health-status", type=int, default=200)
parser.add_argument("--ignore-sigterm", action="store_true")
parser.add_argument("--serve-in-worker", action="store_true")
parser.add_argument("--worker-session", action="store_true")
parser.add_argument("--worker-group", action="store_true")
parser.add_argument("--worker-outlives", action="store_true")
parser.add_argument("--worker-ignores-sigterm", action="store_true")
args = parser.parse_args()
port = int(os.environ["PORT"])
print(f"engine started pid={os.getpid()} PORT={port}", flush=True)
print(f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}", flush=True)

if args.fail_with is not None:
    for number in range(150):
        print(f"loading weights part {number}")
    print(args.last_words, file=sys.stderr, flush=True)
    sys.exit(args.fail_with)

def on_sigterm(signum, frame):
    if args.ignore_sigterm:
        print("ignoring SIGTERM", flush=True)
        return
    print("received SIGTERM, shutting down", flush=True)
    os._exit(0)

signal.signal(signal.SIGTERM, on_sigterm)
time.sleep(args.delay)

if args.serve_in_worker:
    worker = os.fork()
    if worker:
        def stop_worker(signum, frame):
            os.kill(worker, signal.SIGTERM)
            os._exit(0)
        signal.signal(signal.SIGTERM, stop_worker)
        os.waitpid(worker, 0)
        sys.exit(0)
    if args.worker_session:
        os.setsid()
    if args.worker_group:
        os.setpgid(0, 0)
    if args.worker_ignores_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    leader = os.getppid()
    def exit_when_orphaned():
        while os.getppid() == leader:
            time.sleep(0.1)
        os._exit(0)
    if not args.worker_outlives:
        threading.Thread(target=exit_when_orphaned, daemon=True).start()
    print(f"worker pid={os.getpid()} serves", flush=True)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            if args.health_status != 200:
                print(f"health {args.health_status}", flush=True)
            self.answer(args.health_status, b"ok")
        elif self.path == "/v1/models":
            self.answer(200, json.dumps({"object": "list", "data": [{"id": "tiny"}]}).encode())
        elif self.path == "/hello":
            print("said hello", flush=True)
            self.answer(200, b"hello")
        else:
            self.answer(404, b"")

    def do_POST(self):
        if self.path == "/crash":
            self.answer(200, b"bye")
            print("crashing on request", flush=True)
            os._exit(7)
        if self.path == "/sicken":  # as a vLLM whose engine core died: the server runs on
            args.health_status = 503
            self.answer(200, b"sick")
            return
        self.answer(404, b"")

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def a_record(*, replica_id: str = "tiny-5", pid: int, process_start_time: int) -> ShardRecord:
    return ShardRecord(
        replica_id=replica_id,
        shard_index=0,
        model="tiny",
        port=free_port(),
        gpus=(0,),
        command=("vllm", "serve", "tiny"),
        pid=pid,
        process_start_time=process_start_time,
        log_path=f"/nonexistent/{replica_id}-0.log",
        started_at=datetime.now(UTC),
        state=ShardState.READY,
    )


async def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)


@dataclass
class ChangeLog:
    """Every change one supervisor reported, in order."""

    changes: list[ShardChange] = field(default_factory=list)

    def states(self, key: ShardKey) -> list[ShardState]:
        return [change.state for change in self.changes_of(key)]

    def changes_of(self, key: ShardKey) -> list[ShardChange]:
        return [c for c in self.changes if (c.replica_id, c.shard_index) == key]

    async def wait_for(
        self, key: ShardKey, state: ShardState, timeout_s: float = 10.0
    ) -> ShardChange:
        await eventually(lambda: state in self.states(key), f"{key} {state}", timeout_s)
        return next(change for change in self.changes_of(key) if change.state is state)


@dataclass
class Agent:
    supervisor: EngineSupervisor
    log: ChangeLog


@dataclass
class Node:
    """One machine's state dir; each ``agent()`` is an agent process starting on it."""

    state_dir: Path
    engine_script: Path
    agents: list[Agent] = field(default_factory=list)
    engines: dict[int, int] = field(default_factory=dict)  # pid -> start time
    workers: dict[int, int] = field(default_factory=dict)  # pid -> start time

    def agent(self, **settings: Any) -> Agent:
        """``settings``: the supervisor's keyword arguments, for a test that lowers a bound."""
        log = ChangeLog()

        def on_change(change: ShardChange) -> None:
            log.changes.append(change)
            if change.pid is not None and change.pid not in self.engines:
                start_time = process_identity(change.pid)
                if start_time is not None:
                    self.engines[change.pid] = start_time

        agent = Agent(EngineSupervisor(self.state_dir, on_change, **settings), log)
        self.agents.append(agent)
        return agent

    def spec(
        self,
        *engine_args: str,
        replica_id: str = "tiny-1",
        gpus: tuple[int, ...] = (0,),
        engine: str = "vllm",
    ) -> ShardSpec:
        return ShardSpec(
            replica_id=replica_id,
            shard_index=0,
            model="tiny",
            argv=(sys.executable, str(self.engine_script), *engine_args),
            gpus=gpus,
            port=free_port(),
            engine=engine,
        )

    def engine_log(self, record: ShardRecord) -> str:
        return Path(record.log_path).read_text()

    def reap_engines(self) -> None:
        """Kill and reap every engine a test started, whatever the test left behind."""
        for pid, start_time in self.engines.items():
            stat = read_proc_stat(pid)
            if stat is not None and stat.start_time == start_time:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        for pid, start_time in self.workers.items():
            stat = read_proc_stat(pid)
            if stat is not None and stat.start_time == start_time:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    script = tmp_path / "engine.py"
    script.write_text(ENGINE_SOURCE)
    node = Node(state_dir=tmp_path / "agent-state", engine_script=script)
    try:
        yield node
    finally:
        for agent in node.agents:
            await agent.supervisor.shutdown()
        node.reap_engines()


@pytest.fixture
def unrelated_process() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()


async def test_a_started_engine_reports_starting_then_ready_and_serves(node: Node) -> None:
    agent = node.agent()
    spec = node.spec("--delay", "0.3", gpus=(0, 1))

    record = await agent.supervisor.start(spec)

    assert record.state is ShardState.STARTING
    assert is_same_process(record)
    assert RecordStore(node.state_dir).load_all() == [record]
    await agent.log.wait_for(spec.key, ShardState.READY)
    assert agent.log.states(spec.key) == [ShardState.STARTING, ShardState.READY]
    assert agent.log.changes[0].pid == record.pid
    async with httpx.AsyncClient(base_url=spec.readiness_url) as client:
        assert (await client.get("/v1/models")).json()["data"][0]["id"] == "tiny"
    assert "CUDA_VISIBLE_DEVICES=0,1" in node.engine_log(record)
    assert f"PORT={spec.port}" in node.engine_log(record)
    assert [r.state for r in agent.supervisor.inventory()] == [ShardState.READY]
    assert [r.state for r in RecordStore(node.state_dir).load_all()] == [ShardState.READY]


def last_line(path: Path) -> str:
    return path.read_text().splitlines()[-1]


async def test_a_crash_loop_leaves_the_last_launchs_log_and_the_three_before_it(
    node: Node,
) -> None:
    agent = node.agent()
    spec = node.spec()
    for launch in range(1, 7):
        crashing = msgspec.structs.replace(
            spec, argv=(*spec.argv, "--fail-with", "3", "--last-words", f"launch {launch} died")
        )
        await agent.supervisor.start(crashing)
        await eventually(
            lambda launch=launch: agent.log.states(spec.key).count(ShardState.FAILED) == launch,
            f"launch {launch} failed",
        )
        assert agent.log.changes[-1].log_tail[-1] == f"launch {launch} died"

    logs = agent.supervisor.log_path(spec.key)
    assert sorted(p.name for p in logs.parent.iterdir()) == [
        f"{logs.name}{suffix}" for suffix in ("", ".1", ".2", ".3")
    ]
    last_words = [last_line(Path(f"{logs}{suffix}")) for suffix in ("", ".1", ".2", ".3")]
    assert last_words == [f"launch {launch} died" for launch in (6, 5, 4, 3)]


async def test_starting_a_running_shard_again_returns_the_same_engine(node: Node) -> None:
    agent = node.agent()
    spec = node.spec()
    first = await agent.supervisor.start(spec)

    while_starting = await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)
    once_ready = await agent.supervisor.start(spec)

    assert while_starting.pid == once_ready.pid == first.pid
    assert once_ready.state is ShardState.READY
    assert agent.log.states(spec.key) == [ShardState.STARTING, ShardState.READY]
    assert node.engine_log(first).count("engine started") == 1


@pytest.mark.parametrize(
    ("another_port", "gpus"), [(True, (0,)), (False, (1,))], ids=["port", "gpus"]
)
async def test_a_start_for_a_running_shard_on_another_port_or_gpus_is_refused_changing_nothing(
    node: Node, another_port: bool, gpus: tuple[int, ...]
) -> None:
    """Acknowledged, the control plane would route to a port this shard never serves on."""
    agent = node.agent()
    spec = node.spec()
    first = await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)
    asked = msgspec.structs.replace(
        spec, port=free_port() if another_port else spec.port, gpus=gpus
    )

    with pytest.raises(EngineError) as refused:
        await agent.supervisor.start(asked)

    assert str(refused.value) == (
        f"replica tiny-1 shard 0 already runs on port {spec.port} with GPUs [0] "
        f"(pid {first.pid}); stop it before starting it on port {asked.port} "
        f"with GPUs {list(asked.gpus)}"
    )
    assert [(r.pid, r.port, r.state) for r in agent.supervisor.inventory()] == [
        (first.pid, spec.port, ShardState.READY)
    ]
    assert agent.log.states(spec.key) == [ShardState.STARTING, ShardState.READY]
    assert node.engine_log(first).count("engine started") == 1


async def test_stop_terminates_the_engine_and_reports_stopped(node: Node) -> None:
    agent = node.agent()
    spec = node.spec()
    record = await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)

    await agent.supervisor.stop(spec.replica_id, spec.shard_index, grace_s=5.0)

    stopped = agent.log.changes[-1]
    assert (stopped.state, stopped.exit_code, stopped.pid) == (ShardState.STOPPED, 0, record.pid)
    assert stopped.log_tail == ()
    assert agent.supervisor.log_tail(spec.replica_id, 0)[-1] == "received SIGTERM, shutting down"
    assert process_identity(record.pid) is None
    assert agent.supervisor.inventory() == []
    assert RecordStore(node.state_dir).load_all() == []


async def test_an_engine_stopped_before_it_was_ready_reports_its_log_tail(node: Node) -> None:
    agent = node.agent()
    spec = node.spec("--delay", "60")
    record = await agent.supervisor.start(spec)
    started = f"engine started pid={record.pid} PORT={spec.port}"
    await wait_until(
        lambda: started in agent.supervisor.log_tail(spec.replica_id, 0), what="the engine's log"
    )

    await agent.supervisor.stop(spec.replica_id, spec.shard_index, grace_s=5.0)

    stopped = agent.log.changes[-1]
    assert (stopped.state, stopped.pid) == (ShardState.STOPPED, record.pid)
    assert started in stopped.log_tail


async def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace(node: Node) -> None:
    agent = node.agent()
    spec = node.spec("--ignore-sigterm")
    record = await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)
    asked_at = time.monotonic()

    await agent.supervisor.stop(spec.replica_id, spec.shard_index, grace_s=0.5)

    assert time.monotonic() - asked_at >= 0.5
    assert agent.log.changes[-1].exit_code == -signal.SIGKILL
    assert "ignoring SIGTERM" in agent.supervisor.log_tail(spec.replica_id, 0)
    assert process_identity(record.pid) is None


async def test_an_engine_that_exits_with_an_error_is_reported_failed_with_its_log(
    node: Node,
) -> None:
    agent = node.agent()
    spec = node.spec("--fail-with", "3")

    await agent.supervisor.start(spec)
    failed = await agent.log.wait_for(spec.key, ShardState.FAILED)

    assert agent.log.states(spec.key) == [ShardState.STARTING, ShardState.FAILED]
    assert failed.exit_code == 3
    assert failed.error == "engine exited with code 3"
    assert len(failed.log_tail) == 100
    assert failed.log_tail[-2:] == (
        "loading weights part 149",
        "fatal: not enough memory for the KV cache",
    )
    assert [r.state for r in agent.supervisor.inventory()] == [ShardState.FAILED]
    assert RecordStore(node.state_dir).load_all() == []


async def test_a_failure_its_log_explains_is_reported_with_that_one_line_reason(
    node: Node,
) -> None:
    agent = node.agent()
    missing = (
        "gguf_init_from_file: failed to open GGUF file '/models/missing.gguf' "
        "(No such file or directory)"
    )
    spec = node.spec("--fail-with", "1", "--last-words", missing, engine="llamacpp")

    await agent.supervisor.start(spec)
    failed = await agent.log.wait_for(spec.key, ShardState.FAILED)

    assert failed.error == (f"engine exited with code 1: model file not found ({missing})")
    assert failed.log_tail[-1] == missing


async def test_each_engine_is_probed_at_its_profiles_paths(node: Node) -> None:
    """A generic OpenAI server is ready once /v1/models answers; llama.cpp, whose /health
    answers 503 while it loads, is not ready while /health says so."""
    agent = node.agent()
    generic = node.spec("--health-status", "404", replica_id="generic-1", engine="openai")
    loading = node.spec("--health-status", "503", replica_id="loading-1", engine="llamacpp")

    await agent.supervisor.start(generic)
    loading_record = await agent.supervisor.start(loading)
    await agent.log.wait_for(generic.key, ShardState.READY)
    await eventually(
        lambda: node.engine_log(loading_record).count("health 503") >= 3,
        "three readiness probes of the loading engine",
    )

    assert agent.log.states(loading.key) == [ShardState.STARTING]
    assert "health 404" not in node.engine_log(
        next(r for r in agent.supervisor.inventory() if r.key == generic.key)
    )


async def test_a_crash_after_ready_is_reported_at_once(node: Node) -> None:
    agent = node.agent()
    spec = node.spec()
    await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)

    async with httpx.AsyncClient(base_url=spec.readiness_url) as client:
        await client.post("/crash")
    failed = await agent.log.wait_for(spec.key, ShardState.FAILED, timeout_s=2.0)

    assert failed.exit_code == 7
    assert failed.log_tail[-1] == "crashing on request"


@contextlib.contextmanager
def another_program_on(port: int, *, answering: Path | None) -> Iterator[subprocess.Popen[bytes]]:
    """Another program listening on ``port`` on loopback, in a session of its own: the
    engine script (``answering``: it answers the readiness checks too) or a bare socket."""
    bare = (
        "import socket, time\n"
        "s = socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('127.0.0.1', {port}))\n"
        "s.listen()\n"
        "time.sleep(120)\n"
    )
    argv = [sys.executable, str(answering)] if answering else [sys.executable, "-c", bare]
    process = subprocess.Popen(
        argv,
        env={**os.environ, "PORT": str(port), "CUDA_VISIBLE_DEVICES": ""},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_listening(port, process)
        yield process
    finally:
        process.kill()
        process.wait()


def wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10.0
    while True:
        assert process.poll() is None, "the other program exited"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.02)


async def test_an_engine_whose_port_another_program_answers_on_fails_and_is_never_ready(
    node: Node,
) -> None:
    agent = node.agent()
    spec = node.spec("--delay", "30")  # loading its weights: it has not tried to bind yet
    with another_program_on(spec.port, answering=node.engine_script) as other:
        record = await agent.supervisor.start(spec)
        failed = await agent.log.wait_for(spec.key, ShardState.FAILED)

        assert agent.log.states(spec.key) == [ShardState.STARTING, ShardState.FAILED]
        assert str(failed.error).startswith(
            f"port {spec.port} is held by pid {other.pid}, not our engine"
        )
        assert failed.port_held_elsewhere, "the control plane is not told to avoid the port"
        # Stopped by the agent, whether or not it had got as far as printing anything.
        assert process_identity(record.pid) is None
        assert other.poll() is None, "the other program is not the agent's to stop"
        assert [r.state for r in agent.supervisor.inventory()] == [ShardState.FAILED]
        assert RecordStore(node.state_dir).load_all() == []


async def test_an_engine_that_cannot_bind_names_the_program_holding_its_port(node: Node) -> None:
    agent = node.agent()
    spec = node.spec()
    with another_program_on(spec.port, answering=None) as other:
        await agent.supervisor.start(spec)
        failed = await agent.log.wait_for(spec.key, ShardState.FAILED)

    assert agent.log.states(spec.key) == [ShardState.STARTING, ShardState.FAILED]
    assert str(failed.error).startswith(
        f"engine exited with code 1; port {spec.port} is held by pid {other.pid}, not our engine"
    )
    assert any("Address already in use" in line for line in failed.log_tail)
    assert "; address already in use (" in str(failed.error)
    assert failed.port_held_elsewhere, "the control plane is not told to avoid the port"


@pytest.mark.parametrize("own_session", [False, True], ids=["same session", "own session"])
async def test_an_engine_that_serves_from_a_worker_it_forked_is_ready(
    node: Node, own_session: bool
) -> None:
    agent = node.agent()
    spec = node.spec("--serve-in-worker", *(["--worker-session"] if own_session else []))

    record = await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)
    await agent.supervisor.stop(spec.replica_id, spec.shard_index, grace_s=5.0)

    assert "serves" in node.engine_log(record)
    assert agent.log.states(spec.key) == [ShardState.STARTING, ShardState.READY, ShardState.STOPPED]


async def test_a_reattached_engine_serving_from_a_worker_is_ready_again(node: Node) -> None:
    first_agent = node.agent()
    spec = node.spec("--serve-in-worker")
    record = await first_agent.supervisor.start(spec)
    await first_agent.log.wait_for(spec.key, ShardState.READY)
    await first_agent.supervisor.shutdown()

    second_agent = node.agent()
    assert [r.pid for r in await second_agent.supervisor.reattach()] == [record.pid]

    await second_agent.log.wait_for(spec.key, ShardState.READY)
    assert second_agent.log.states(spec.key) == [ShardState.STARTING, ShardState.READY]


async def test_a_failed_shard_can_be_stopped_and_started_again(node: Node) -> None:
    agent = node.agent()
    spec = node.spec()
    first = await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)
    os.killpg(first.pid, signal.SIGKILL)
    failed = await agent.log.wait_for(spec.key, ShardState.FAILED)
    assert failed.error == "engine was killed by SIGKILL"

    await agent.supervisor.stop(spec.replica_id, spec.shard_index)
    second = await agent.supervisor.start(spec)

    assert agent.log.states(spec.key)[-2:] == [ShardState.STOPPED, ShardState.STARTING]
    assert second.pid != first.pid
    assert [r.pid for r in agent.supervisor.inventory()] == [second.pid]


async def test_a_missing_executable_is_reported_failed(node: Node) -> None:
    agent = node.agent()
    spec = ShardSpec(
        replica_id="tiny-9", shard_index=0, model="tiny", argv=("/nonexistent/vllm",), port=1
    )

    with pytest.raises(EngineLaunchError, match="No such file"):
        await agent.supervisor.start(spec)

    [failed] = agent.log.changes
    assert failed.state is ShardState.FAILED
    assert "/nonexistent/vllm" in str(failed.error)
    assert agent.supervisor.inventory() == []


async def test_stopping_an_unknown_shard_still_reports_stopped(node: Node) -> None:
    agent = node.agent()

    await agent.supervisor.stop("never-started-1", 0)
    await agent.supervisor.stop("never-started-1", 0)

    assert agent.log.states(ShardKey("never-started-1", 0)) == [ShardState.STOPPED] * 2


async def test_a_restarted_agent_reattaches_its_running_engine(node: Node) -> None:
    first_agent = node.agent()
    spec = node.spec()
    record = await first_agent.supervisor.start(spec)
    await first_agent.log.wait_for(spec.key, ShardState.READY)

    await first_agent.supervisor.shutdown()
    assert is_same_process(record)
    async with httpx.AsyncClient(base_url=spec.readiness_url) as client:
        await client.get("/hello")
    second_agent = node.agent()
    adopted = await second_agent.supervisor.reattach()

    assert [r.pid for r in adopted] == [record.pid]
    await second_agent.log.wait_for(spec.key, ShardState.READY)
    assert second_agent.log.states(spec.key) == [ShardState.STARTING, ShardState.READY]
    assert node.engine_log(record).count("engine started") == 1
    assert second_agent.supervisor.log_tail(spec.replica_id, 0)[-1] == "said hello"
    assert [(r.pid, r.state) for r in second_agent.supervisor.inventory()] == [
        (record.pid, ShardState.READY)
    ]


async def test_a_reattached_engine_that_dies_is_reported_failed(node: Node) -> None:
    first_agent = node.agent()
    spec = node.spec()
    record = await first_agent.supervisor.start(spec)
    await first_agent.log.wait_for(spec.key, ShardState.READY)
    await first_agent.supervisor.shutdown()
    second_agent = node.agent()
    await second_agent.supervisor.reattach()
    await second_agent.log.wait_for(spec.key, ShardState.READY)

    os.killpg(record.pid, signal.SIGKILL)
    failed = await second_agent.log.wait_for(spec.key, ShardState.FAILED, timeout_s=3.0)

    assert failed.exit_code is None
    assert RecordStore(node.state_dir).load_all() == []


async def test_a_reattached_engine_can_be_stopped(node: Node) -> None:
    first_agent = node.agent()
    spec = node.spec()
    record = await first_agent.supervisor.start(spec)
    await first_agent.log.wait_for(spec.key, ShardState.READY)
    await first_agent.supervisor.shutdown()
    second_agent = node.agent()
    await second_agent.supervisor.reattach()

    await second_agent.supervisor.stop(spec.replica_id, spec.shard_index, grace_s=5.0)

    assert second_agent.log.states(spec.key)[-1] is ShardState.STOPPED
    assert not is_same_process(record)
    assert "received SIGTERM, shutting down" in node.engine_log(record)


async def test_an_engine_gone_while_the_agent_was_away_is_reported_failed(node: Node) -> None:
    first_agent = node.agent()
    spec = node.spec()
    record = await first_agent.supervisor.start(spec)
    await first_agent.log.wait_for(spec.key, ShardState.READY)
    await first_agent.supervisor.shutdown()
    os.killpg(record.pid, signal.SIGKILL)
    await eventually(lambda: not is_same_process(record), "the engine to die")

    second_agent = node.agent()
    adopted = await second_agent.supervisor.reattach()

    assert adopted == []
    [failed] = second_agent.log.changes
    assert (failed.state, failed.error) == (
        ShardState.FAILED,
        f"engine exited while the agent was away (pid {record.pid} is gone)",
    )
    assert "engine started" in failed.log_tail[1]
    assert RecordStore(node.state_dir).load_all() == []


async def test_a_record_whose_pid_was_reused_is_not_adopted(
    node: Node, unrelated_process: subprocess.Popen[bytes]
) -> None:
    start_time = process_identity(unrelated_process.pid)
    assert start_time is not None
    RecordStore(node.state_dir).save(
        a_record(replica_id="tiny-4", pid=unrelated_process.pid, process_start_time=start_time - 1)
    )
    agent = node.agent()

    adopted = await agent.supervisor.reattach()
    await agent.supervisor.stop("tiny-4", 0, grace_s=0.1)

    assert adopted == []
    assert agent.log.states(ShardKey("tiny-4", 0)) == [ShardState.FAILED, ShardState.STOPPED]
    assert unrelated_process.poll() is None
    assert RecordStore(node.state_dir).load_all() == []


def a_strangers_record(process: subprocess.Popen[bytes]) -> ShardRecord:
    """A record naming ``process`` by its very pid and start time, with a launch token it
    was not started with: what a record kept across a reboot finds when a program that
    started at the same tick took the engine's pid, or a record copied from another state
    directory names (another agent's engine)."""
    start_time = process_identity(process.pid)
    assert start_time is not None
    record = a_record(replica_id="tiny-6", pid=process.pid, process_start_time=start_time)
    return msgspec.structs.replace(record, launch_token="a-token-no-process-has")


async def test_a_record_naming_a_process_without_its_launch_token_is_not_adopted(
    node: Node, unrelated_process: subprocess.Popen[bytes]
) -> None:
    RecordStore(node.state_dir).save(a_strangers_record(unrelated_process))
    agent = node.agent()

    adopted = await agent.supervisor.reattach()
    await agent.supervisor.stop("tiny-6", 0, grace_s=0.1)

    assert adopted == []
    assert agent.log.states(ShardKey("tiny-6", 0)) == [ShardState.FAILED, ShardState.STOPPED]
    assert unrelated_process.poll() is None
    assert RecordStore(node.state_dir).load_all() == []


async def test_stop_engines_leaves_a_process_without_the_records_launch_token_alone(
    node: Node, unrelated_process: subprocess.Popen[bytes]
) -> None:
    RecordStore(node.state_dir).save(a_strangers_record(unrelated_process))

    [stop] = await asyncio.to_thread(stop_recorded_engines, node.state_dir, 0.5)

    assert stop.outcome == "gone"
    assert unrelated_process.poll() is None
    assert RecordStore(node.state_dir).load_all() == []


def clearing_its_environment(spec: ShardSpec) -> ShardSpec:
    """``spec`` run by ``env -i``: the engine gets its port and GPUs, no launch token."""
    gpus = ",".join(str(gpu) for gpu in spec.gpus)
    argv = ("env", "-i", f"PORT={spec.port}", f"CUDA_VISIBLE_DEVICES={gpus}", *spec.argv)
    return msgspec.structs.replace(spec, argv=argv)


async def test_an_engine_that_clears_its_environment_is_adopted_by_the_next_agent(
    node: Node,
) -> None:
    """Before, the next agent found no launch token in its environment, left it running
    (its port and GPUs held) and reported the shard failed; the replacement the control
    plane placed then met a port already taken."""
    first_agent = node.agent()
    spec = clearing_its_environment(node.spec())
    record = await first_agent.supervisor.start(spec)
    await first_agent.log.wait_for(spec.key, ShardState.READY)
    await first_agent.supervisor.shutdown()

    second_agent = node.agent()
    adopted = await second_agent.supervisor.reattach()

    assert [r.pid for r in adopted] == [record.pid]
    await second_agent.log.wait_for(spec.key, ShardState.READY)
    await second_agent.supervisor.stop(spec.replica_id, spec.shard_index, grace_s=5)
    assert not is_same_process(record)


def this_boot() -> str:
    """The kernel's boot id, as the agent records it for an engine it starts."""
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def without_a_token(
    process: subprocess.Popen[bytes], *, boot_id: str, replica_id: str = "tiny-7"
) -> ShardRecord:
    """A record of an engine that cleared its environment, naming ``process`` by its pid
    and start time, written in the boot ``boot_id``."""
    start_time = process_identity(process.pid)
    assert start_time is not None
    record = a_record(replica_id=replica_id, pid=process.pid, process_start_time=start_time)
    return msgspec.structs.replace(record, launch_token="its-token", boot_id=boot_id)


async def test_a_record_without_a_token_from_before_a_reboot_names_no_engine(
    node: Node, unrelated_process: subprocess.Popen[bytes]
) -> None:
    """After a reboot a program may have the pid and start time a record kept names: it is
    neither adopted nor signalled, and the failure says why."""
    RecordStore(node.state_dir).save(without_a_token(unrelated_process, boot_id="another-boot"))
    agent = node.agent()

    adopted = await agent.supervisor.reattach()

    assert adopted == []
    [failed] = agent.log.changes
    assert failed.error == (
        f"pid {unrelated_process.pid} runs with the engine's start time but is not taken for "
        "it: it holds no launch token, and the machine has rebooted since"
    )
    assert unrelated_process.poll() is None


@pytest.fixture
def in_our_group() -> Iterator[subprocess.Popen[bytes]]:
    """A program in the test's own process group, with an environment of its own."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={"PATH": os.environ["PATH"]}
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()


async def test_a_process_without_a_token_that_leads_no_group_of_its_own_is_no_engine(
    node: Node, in_our_group: subprocess.Popen[bytes]
) -> None:
    """The agent spawns every engine as the leader of its own session and group."""
    record = without_a_token(in_our_group, boot_id=this_boot())
    RecordStore(node.state_dir).save(record)
    agent = node.agent()

    adopted = await agent.supervisor.reattach()

    assert adopted == []
    [failed] = agent.log.changes
    assert (failed.error or "").endswith("and no longer leads its own process group")
    assert in_our_group.poll() is None


async def test_a_record_an_agent_was_killed_writing_leaves_no_temporary_file_behind(
    node: Node,
) -> None:
    """An agent killed between writing a record's temporary file and renaming it over the
    record leaves the temporary file: each shard killed so would leave one more for ever."""
    first_agent = node.agent()
    spec = node.spec()
    record = await first_agent.supervisor.start(spec)
    await first_agent.supervisor.shutdown()
    shards = RecordStore(node.state_dir).directory
    half_written = shards / ".tiny-1-0.json.tmp"
    half_written.write_bytes(msgspec.json.encode(record)[:40])
    (shards / ".tiny-9-0.launch.tmp").write_bytes(b"{")

    second_agent = node.agent()
    adopted = await second_agent.supervisor.reattach()

    assert [r.pid for r in adopted] == [record.pid]
    assert sorted(path.name for path in shards.iterdir()) == ["tiny-1-0.json"]


async def test_shutdown_can_stop_every_engine(node: Node) -> None:
    agent = node.agent()
    records = [await agent.supervisor.start(node.spec(replica_id=f"tiny-{n}")) for n in (1, 2)]

    await agent.supervisor.shutdown(stop_engines=True, grace_s=5.0)

    assert (
        sorted(c.state for c in agent.log.changes if c.state is ShardState.STOPPED)
        == [ShardState.STOPPED] * 2
    )
    assert not any(is_same_process(record) for record in records)


def test_an_exited_but_unreaped_engine_is_not_the_recorded_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        start_time = process_identity(child.pid)
        assert start_time is not None
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert read_proc_stat(child.pid) == ("Z", start_time)

        assert not is_same_process(a_record(pid=child.pid, process_start_time=start_time))
    finally:
        child.wait()


# -- a hostile or unlucky world ----------------------------------------------------------


def fill_the_disk_for(node: Node, key: ShardKey, kind: str = "json") -> None:
    """From now on, writing the shard's record (``kind`` "launch": its launch record) fails
    as on a full disk: the temporary file it is written to first is ``/dev/full``."""
    shards = RecordStore(node.state_dir).directory
    shards.mkdir(parents=True, exist_ok=True)
    (shards / f".{key.replica_id}-{key.shard_index}.{kind}.tmp").symlink_to("/dev/full")


def worker_of(node: Node, record: ShardRecord) -> tuple[int, int]:
    """The pid and start time of the worker the engine forked to serve."""
    line = next(line for line in node.engine_log(record).splitlines() if "serves" in line)
    pid = int(line.split("pid=")[1].split()[0])
    start_time = process_identity(pid)
    assert start_time is not None
    node.workers[pid] = start_time
    return pid, start_time


def nothing_listens_on(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
    except OSError:
        return True
    return False


async def test_a_full_disk_when_the_engine_becomes_ready_neither_hides_ready_nor_its_crash(
    node: Node,
) -> None:
    agent = node.agent()
    spec = node.spec("--delay", "0.3")
    await agent.supervisor.start(spec)
    fill_the_disk_for(node, spec.key)

    await agent.log.wait_for(spec.key, ShardState.READY)
    async with httpx.AsyncClient(base_url=spec.readiness_url) as client:
        await client.post("/crash")
    failed = await agent.log.wait_for(spec.key, ShardState.FAILED)

    assert failed.exit_code == 7
    assert [r.state for r in agent.supervisor.inventory()] == [ShardState.FAILED]


async def test_a_full_disk_does_not_keep_a_restarted_agent_from_reattaching(node: Node) -> None:
    first_agent = node.agent()
    spec = node.spec()
    record = await first_agent.supervisor.start(spec)
    await first_agent.log.wait_for(spec.key, ShardState.READY)
    await first_agent.supervisor.shutdown()
    fill_the_disk_for(node, spec.key)

    second_agent = node.agent()
    adopted = await second_agent.supervisor.reattach()

    assert [r.pid for r in adopted] == [record.pid]
    await second_agent.log.wait_for(spec.key, ShardState.READY)
    assert [r.pid for r in RecordStore(node.state_dir).load_all()] == [record.pid]


async def test_an_engine_log_on_a_full_disk_fails_the_start_naming_the_log_not_the_engine(
    node: Node,
) -> None:
    """The log cannot be moved aside (a directory stands where its oldest copy goes), and the
    disk it is on is full (it is ``/dev/full``)."""
    agent = node.agent()
    spec = node.spec()
    log_path = agent.supervisor.log_path(spec.key)
    log_path.parent.mkdir(parents=True)
    earlier_log(log_path, KEPT_ENGINE_LOGS).mkdir()
    log_path.symlink_to("/dev/full")

    with pytest.raises(EngineLaunchError) as raised:
        await agent.supervisor.start(spec)

    reason = f"cannot write the engine log: [Errno 28] No space left on device: '{log_path}'"
    assert str(raised.value) == reason
    assert [(c.state, c.error) for c in agent.log.changes] == [(ShardState.FAILED, reason)]
    assert agent.supervisor.inventory() == []
    assert RecordStore(node.state_dir).load_all() == []
    assert RecordStore(node.state_dir).load_launches() == []


@pytest.mark.parametrize("kind", ["launch", "json"], ids=["before the spawn", "after it"])
async def test_a_record_on_a_full_disk_fails_the_start_naming_the_record(
    node: Node, kind: str
) -> None:
    agent = node.agent()
    spec = node.spec()
    fill_the_disk_for(node, spec.key, kind)

    with pytest.raises(EngineLaunchError) as raised:
        await agent.supervisor.start(spec)

    record_path = RecordStore(node.state_dir).directory / f"tiny-1-0.{kind}"
    reason = f"cannot record the engine: [Errno 28] No space left on device: '{record_path}'"
    assert str(raised.value) == reason
    assert [(c.state, c.error) for c in agent.log.changes_of(spec.key)][-1] == (
        ShardState.FAILED,
        reason,
    )
    assert agent.supervisor.inventory() == []
    assert not any(is_running(pid, start) for pid, start in node.engines.items())


@pytest.mark.parametrize("kind", ["launch", "json"], ids=["before the spawn", "after it"])
async def test_a_record_a_full_disk_refused_leaves_no_temporary_file(node: Node, kind: str) -> None:
    """Each start a full disk refuses left the temporary file its record was being written
    to, one more inode on the disk that is out of room, until the agent restarted."""
    agent = node.agent()
    spec = node.spec()
    fill_the_disk_for(node, spec.key, kind)

    with pytest.raises(EngineLaunchError):
        await agent.supervisor.start(spec)

    shards = RecordStore(node.state_dir).directory
    assert [path.name for path in shards.iterdir()] == []


def on_a_failing_disk(node: Node) -> tuple[Agent, FailingDisk]:
    """An agent whose state directory refuses to remove files once the disk is told to."""
    disk = FailingDisk()
    return node.agent(records=RecordStore(node.state_dir, unlink=disk.unlink)), disk


async def test_a_stop_on_a_read_only_disk_is_reported_and_the_record_left_removed_later(
    node: Node,
) -> None:
    agent, disk = on_a_failing_disk(node)
    spec = node.spec()
    record = await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)
    disk.remounted_read_only()

    await agent.supervisor.stop(spec.replica_id, spec.shard_index, grace_s=5.0)

    assert agent.log.states(spec.key)[-1] is ShardState.STOPPED
    assert agent.supervisor.inventory() == []
    assert not is_same_process(record)
    assert RecordStore(node.state_dir).load_all() == [
        msgspec.structs.replace(record, state=ShardState.READY)
    ]
    disk.repaired()
    await agent.supervisor.stop("never-started-1", 0)
    assert RecordStore(node.state_dir).load_all() == []


async def test_an_engine_that_exits_on_a_failing_disk_is_still_listed_failed(node: Node) -> None:
    agent, disk = on_a_failing_disk(node)
    spec = node.spec()
    await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)
    disk.failing_with_eio()

    async with httpx.AsyncClient(base_url=spec.readiness_url) as client:
        await client.post("/crash")
    await agent.log.wait_for(spec.key, ShardState.FAILED)

    await eventually(
        lambda: [r.state for r in agent.supervisor.inventory()] == [ShardState.FAILED],
        "the failed shard to be listed",
    )


async def test_a_record_a_failing_disk_keeps_neither_stops_a_restart_nor_signals_its_pid(
    node: Node, unrelated_process: subprocess.Popen[bytes]
) -> None:
    """The stale record's pid now belongs to another program (with another start time)."""
    first_agent = node.agent()
    spec = node.spec()
    running = await first_agent.supervisor.start(spec)
    await first_agent.log.wait_for(spec.key, ShardState.READY)
    await first_agent.supervisor.shutdown()
    start_time = process_identity(unrelated_process.pid)
    assert start_time is not None
    stale = a_record(
        replica_id="stale-1", pid=unrelated_process.pid, process_start_time=start_time - 1
    )
    RecordStore(node.state_dir).save(stale)

    second_agent, disk = on_a_failing_disk(node)
    disk.failing_with_eio()
    adopted = await second_agent.supervisor.reattach()

    assert [r.pid for r in adopted] == [running.pid]
    [failed] = second_agent.log.changes_of(stale.key)
    assert (failed.state, failed.error) == (
        ShardState.FAILED,
        f"{AWAY_ERROR} (pid {unrelated_process.pid} is another process now)",
    )
    assert unrelated_process.poll() is None
    assert sorted((r.replica_id, r.state) for r in second_agent.supervisor.inventory()) == [
        ("stale-1", ShardState.FAILED),
        ("tiny-1", ShardState.STARTING),
    ]


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (("{python}", "{engine}", "--delay\0", "1"), {}),
        (("{python}", "{engine}"), {"LD_PRELOAD=/tmp/x.so; A": "1"}),
        (("{python}", "{engine}"), {"": "1"}),
        (("{python}", "{engine}"), {"A": "nul\0byte"}),
    ],
    ids=["nul in argv", "= in an env name", "empty env name", "nul in an env value"],
)
async def test_a_command_no_process_can_be_given_is_reported_failed(
    node: Node, argv: tuple[str, ...], env: dict[str, str]
) -> None:
    agent = node.agent()
    spec = ShardSpec(
        replica_id="tiny-8",
        shard_index=0,
        model="tiny",
        argv=tuple(
            a.format(python=sys.executable, engine=node.engine_script) if "{" in a else a
            for a in argv
        ),
        env=env,
        port=free_port(),
    )

    with pytest.raises(EngineLaunchError, match="cannot start"):
        await agent.supervisor.start(spec)

    assert agent.log.states(spec.key) == [ShardState.FAILED]
    assert agent.supervisor.inventory() == []
    assert RecordStore(node.state_dir).load_all() == []


async def test_workers_an_engine_left_while_the_agent_was_away_are_killed(node: Node) -> None:
    """The leader died while no agent watched it, and a worker that does not notice kept its
    group (and the port, and in production its GPUs)."""
    first_agent = node.agent()
    spec = node.spec("--serve-in-worker", "--worker-outlives")
    record = await first_agent.supervisor.start(spec)
    await first_agent.log.wait_for(spec.key, ShardState.READY)
    await first_agent.supervisor.shutdown()
    worker = worker_of(node, record)
    os.kill(record.pid, signal.SIGKILL)  # the leader alone
    await eventually(lambda: not is_same_process(record), "the leader to die")
    assert is_running(*worker)

    second_agent = node.agent()
    assert await second_agent.supervisor.reattach() == []

    await second_agent.log.wait_for(spec.key, ShardState.FAILED)
    await eventually(lambda: not is_running(*worker), "the worker to be killed", timeout_s=5.0)
    await eventually(lambda: nothing_listens_on(spec.port), "the port to be free")


@pytest.mark.parametrize("own", ["--worker-session", "--worker-group"], ids=["session", "group"])
async def test_a_stop_ends_a_worker_in_a_session_or_group_of_its_own_before_it_reports_stopped(
    node: Node, own: str
) -> None:
    agent = node.agent()
    spec = node.spec("--serve-in-worker", own, "--worker-outlives", "--worker-ignores-sigterm")
    record = await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)
    worker = worker_of(node, record)

    await agent.supervisor.stop(spec.replica_id, spec.shard_index, grace_s=0.5)

    assert agent.log.states(spec.key)[-1] is ShardState.STOPPED
    assert not is_running(*worker)
    assert nothing_listens_on(spec.port)


async def test_stop_engines_kills_the_workers_a_leader_stopped_by_sigterm_leaves(
    node: Node,
) -> None:
    agent = node.agent()
    spec = node.spec("--serve-in-worker", "--worker-outlives", "--worker-ignores-sigterm")
    record = await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)
    await agent.supervisor.shutdown()
    worker = worker_of(node, record)

    [stop] = await asyncio.to_thread(stop_recorded_engines, node.state_dir, 5.0)

    assert stop.outcome == "stopped"
    await eventually(lambda: not is_running(*worker), "the worker to be killed", timeout_s=5.0)
    await eventually(lambda: nothing_listens_on(spec.port), "the port to be free")


AGENT_KILLED_MID_START = r"""
import asyncio, sys
from pathlib import Path
from typing import Any
from agent.engines import EngineSupervisor, ShardSpec

state_dir, engine, port = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])

async def main():
    supervisor = EngineSupervisor(state_dir, lambda change: None)
    argv = (sys.executable, engine)
    spec = ShardSpec(replica_id="tiny-1", shard_index=0, model="tiny", argv=argv, port=port)
    await supervisor.start(spec)

asyncio.run(main())
"""


async def an_agent_killed_mid_start(node: Node) -> tuple[ShardSpec, tuple[int, int]]:
    """An agent spawned an engine and was killed while its record was being written (a slow
    disk: here the write blocks on a FIFO), so no record names the engine: the spec, and the
    engine's pid and start time."""
    spec = node.spec()
    shards = RecordStore(node.state_dir).directory
    shards.mkdir(parents=True)
    os.mkfifo(shards / ".tiny-1-0.json.tmp")
    killed_agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        AGENT_KILLED_MID_START,
        str(node.state_dir),
        spec.argv[1],
        str(spec.port),
    )
    engine_log = node.state_dir / "logs" / "tiny-1-0.log"
    await eventually(
        lambda: engine_log.exists() and "engine started" in engine_log.read_text(),
        "the engine to start",
    )
    engine_pid = int(engine_log.read_text().split("engine started pid=")[1].split()[0])
    start_time = process_identity(engine_pid)
    assert start_time is not None
    node.workers[engine_pid] = start_time
    killed_agent.kill()
    await killed_agent.wait()
    (shards / ".tiny-1-0.json.tmp").unlink()
    assert is_running(engine_pid, start_time)
    return spec, (engine_pid, start_time)


async def test_an_engine_whose_agent_was_killed_before_recording_it_is_not_left_running(
    node: Node,
) -> None:
    spec, engine = await an_agent_killed_mid_start(node)

    agent = node.agent()
    assert await agent.supervisor.reattach() == []

    await eventually(lambda: not is_running(*engine), "the engine to be killed", timeout_s=5.0)
    [failed] = agent.log.changes
    assert (failed.state, failed.pid, failed.port) == (ShardState.FAILED, engine[0], spec.port)
    assert "before it recorded it" in str(failed.error)
    assert [r.state for r in agent.supervisor.inventory()] == [ShardState.FAILED]
    assert RecordStore(node.state_dir).load_all() == []
    assert RecordStore(node.state_dir).load_launches() == []


async def test_stop_engines_kills_an_engine_an_agent_killed_mid_start_never_recorded(
    node: Node,
) -> None:
    spec, engine = await an_agent_killed_mid_start(node)

    assert await asyncio.to_thread(stop_recorded_engines, node.state_dir, 5.0) == []

    await eventually(lambda: not is_running(*engine), "the engine to be killed", timeout_s=5.0)
    await eventually(lambda: nothing_listens_on(spec.port), "the port to be free")
    assert RecordStore(node.state_dir).load_launches() == []


async def test_a_worker_in_a_session_of_its_own_is_killed_when_its_engine_dies(
    node: Node,
) -> None:
    agent = node.agent()
    spec = node.spec("--serve-in-worker", "--worker-session", "--worker-outlives")
    record = await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)
    worker = worker_of(node, record)

    os.kill(record.pid, signal.SIGKILL)  # the leader alone
    await agent.log.wait_for(spec.key, ShardState.FAILED)

    await eventually(lambda: not is_running(*worker), "the worker to be killed", timeout_s=5.0)
    await eventually(lambda: nothing_listens_on(spec.port), "the port to be free")


async def test_a_model_that_fails_again_and_again_keeps_only_its_newest_failures_listed(
    node: Node,
) -> None:
    """The control plane stops only shards that run: without a bound, every replica of a
    crash-looping model would stay listed, until hello and heartbeat were refused."""
    agent = node.agent(failed_kept=2)
    specs = [
        ShardSpec(
            replica_id=f"crashing-{n}",
            shard_index=0,
            model="crashing",
            argv=("sh", "-c", "exit 3"),
            port=free_port(),
        )
        for n in range(1, 4)
    ]

    for spec in specs:
        await agent.supervisor.start(spec)
        await agent.log.wait_for(spec.key, ShardState.FAILED)

    assert [record.key for record in agent.supervisor.inventory()] == [
        spec.key for spec in specs[1:]
    ]


async def test_an_engine_whose_log_cannot_be_read_is_still_reported_failed(node: Node) -> None:
    """A log on a failing disk (EIO) or a stale mount cannot be read back: its tail is lost,
    not the failure. The engine here puts a folder where its log was, which no one can
    read as a file."""
    agent = node.agent()
    log = agent.supervisor.log_path(ShardKey("unreadable-1", 0))
    spec = ShardSpec(
        replica_id="unreadable-1",
        shard_index=0,
        model="unreadable",
        argv=("sh", "-c", 'rm "$0" && mkdir "$0" && exit 3', str(log)),
        port=free_port(),
    )

    await agent.supervisor.start(spec)
    failed = await agent.log.wait_for(spec.key, ShardState.FAILED)

    assert (failed.error, failed.log_tail) == ("engine exited with code 3", ())
    assert [record.state for record in agent.supervisor.inventory()] == [ShardState.FAILED]


async def test_a_serving_engine_that_stops_answering_its_health_checks_is_ended_and_failed(
    node: Node,
) -> None:
    """vLLM's HTTP server runs on when its engine core dies, answering /health 503 and every
    request 500: without a check past readiness, it stayed ``ready`` for ever, and the
    control plane never replaced it."""
    agent = node.agent(liveness=Liveness(interval_s=0.1, failures=3))
    spec = node.spec()
    record = await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)

    async with httpx.AsyncClient() as client:
        await client.post(f"http://127.0.0.1:{spec.port}/sicken", timeout=5)
    failed = await agent.log.wait_for(spec.key, ShardState.FAILED)

    assert failed.error == (
        "the engine stopped answering its health checks: GET /health answered 503 "
        "(3 checks in a row, 0.1 s apart)"
    )
    assert not is_same_process(record)
    assert [r.state for r in agent.supervisor.inventory()] == [ShardState.FAILED]


async def test_a_stop_leaves_the_logs_of_the_shards_that_ended_last_and_no_more(
    node: Node,
) -> None:
    """Replica ids are never used again, so the logs of shards that ended would pile up
    for as long as the agent runs. The agent keeps those of the ``KEPT_ENDED_SHARDS`` that
    ended last, the one it has just stopped among them."""
    logs = node.state_dir / "logs"
    logs.mkdir(parents=True)
    long_ago = time.time() - 86_400
    for n in range(KEPT_ENDED_SHARDS + 50):
        for name in (f"old-{n}-0.log", f"old-{n}-0.log.1"):
            (logs / name).write_text("engine output\n")
            os.utime(logs / name, (long_ago + n, long_ago + n))
    agent = node.agent()
    spec = node.spec(replica_id="tiny-9")
    await agent.supervisor.start(spec)
    await agent.log.wait_for(spec.key, ShardState.READY)

    await agent.supervisor.stop(spec.replica_id, 0, grace_s=5.0)

    stems = {name.split(".log")[0] for name in os.listdir(logs)}
    assert len(stems) == KEPT_ENDED_SHARDS, len(stems)
    assert "tiny-9-0" in stems
    assert "old-51-0" in stems
    assert "old-50-0" not in stems


async def test_an_adopted_engines_logs_an_older_agent_wrote_for_everyone_become_the_agents(
    node: Node,
) -> None:
    first_agent = node.agent()
    spec = node.spec()
    record = await first_agent.supervisor.start(spec)
    await first_agent.log.wait_for(spec.key, ShardState.READY)
    await first_agent.supervisor.shutdown()
    log_path = Path(record.log_path)
    earlier = earlier_log(log_path, 1)
    earlier.write_text("an earlier launch\n")
    for written in (log_path, earlier):  # as an agent of an older release created them
        written.chmod(0o644)

    adopted = await node.agent().supervisor.reattach()

    assert [r.pid for r in adopted] == [record.pid]
    assert [oct(path.stat().st_mode & 0o777) for path in (log_path, earlier)] == ["0o600"] * 2


async def test_the_reason_an_engine_gives_before_a_long_backtrace_is_found(node: Node) -> None:
    """vLLM's workers each print a traceback after the line that says why the load failed;
    before, the reason was searched for only in the 100 lines reported, which a backtrace of
    150 lines fills."""
    agent = node.agent()
    backtrace = 'for n in $(seq 150); do echo "  File \\"worker.py\\", line $n, in load"; done'
    spec = ShardSpec(
        replica_id="aborting-1",
        shard_index=0,
        model="aborting",
        argv=(
            "sh",
            "-c",
            "echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'; "
            f"{backtrace}; exit 1",
        ),
        port=free_port(),
    )

    await agent.supervisor.start(spec)
    failed = await agent.log.wait_for(spec.key, ShardState.FAILED)

    assert failed.error == (
        "engine exited with code 1: CUDA out of memory (torch.OutOfMemoryError: CUDA out of "
        "memory. Tried to allocate 2.00 GiB)"
    )
    assert len(failed.log_tail) == 100
    assert failed.log_tail[-1] == '  File "worker.py", line 150, in load'
