"""``llmgw-dev`` as a newcomer runs it: one command brings up PostgreSQL, the control
plane with its gateway, two agents, a demo model and an API key; the next steps it prints
(a curl through the gateway, an openai SDK snippet) work exactly as printed; Ctrl-C stops
every process it started. With ``--engine llamacpp`` the same holds of llama.cpp's
``llama-server`` serving a real model, and a state directory keeps its engine.

The command starts its own PostgreSQL (``LLMGW_DATABASE_URL`` is removed from its
environment), as it does on a fresh machine, so stopping that cluster is checked too; two
clusters side by side are given databases on the tests' server instead. Each state
directory is made under /tmp and opened to other users: as root, PostgreSQL runs as the
``postgres`` user, which must be able to reach it (pytest's own tmp dirs are private).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.engines.records import RecordStore, is_same_process
from tests.support.fleet import is_running, kill_group
from tests.support.ports import free_port
from tests.support.postgres import PostgresServer, unique_database_name
from tests.support.real_engine import RealEngine
from tests.support.waiting import wait_until

DEV = str(Path(sys.executable).parent / "llmgw-dev")
LAST_LINE_OF_NEXT_STEPS = "Press Ctrl-C"
START_WITHIN_S = 90.0
"""Longer than any one of dev's own waits (60 s each): a step that never ends shows dev's
error, which names it, and its progress lines say how long each step before it took."""
START_ON_A_REAL_ENGINE_WITHIN_S = 90.0
"""Two real engines load the model on two cores shared with other test runs."""
STOP_WITHIN_S = 30.0


@dataclass(frozen=True)
class NextSteps:
    """What ``dev`` printed for the operator to run."""

    environment: dict[str, str]
    history: list[str]
    curl: list[str]
    sdk_snippet: str
    """The shell here-document that runs the openai SDK example."""
    log_verify: str | None
    """The shell line that checks the event log's chain, if one was printed."""

    @classmethod
    def parse(cls, text: str) -> NextSteps:
        raw = text.splitlines()
        lines = [line.strip() for line in raw]
        export = shlex.split(next(line for line in lines if line.startswith("export ")))
        history = next(line for line in lines if "history model demo" in line)
        curl = next(line for line in lines if line.startswith("curl "))
        log_verify = next((line for line in lines if line.endswith(" log verify")), None)
        start = next(i for i, line in enumerate(raw) if line.endswith("<<'PY'"))
        end = raw.index("PY", start)
        return cls(
            environment=dict(word.split("=", 1) for word in export[1:]),
            history=shlex.split(history),
            curl=shlex.split(curl),
            sdk_snippet="\n".join(raw[start : end + 1]) + "\n",
            log_verify=log_verify,
        )

    @property
    def curl_url(self) -> str:
        return next(word for word in self.curl if word.startswith("http://"))

    @property
    def curl_body(self) -> str:
        return self.curl[self.curl.index("-d") + 1]

    @property
    def curl_headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for index, word in enumerate(self.curl):
            if word == "-H":
                name, value = self.curl[index + 1].split(":", 1)
                headers[name.strip()] = value.strip()
        return headers


@pytest.fixture
def state_dir() -> Iterator[Path]:
    with _state_directory() as directory:
        yield directory


@contextlib.contextmanager
def _state_directory() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="llmgw-dev-", dir="/tmp"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        _kill_everything_under(directory)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def client_port() -> int:
    return free_port()


@pytest.fixture
async def dev(state_dir: Path, client_port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    environment = {k: v for k, v in os.environ.items() if k != "LLMGW_DATABASE_URL"}
    async with _running_dev(state_dir, client_port, environment) as process:
        yield process


@contextlib.asynccontextmanager
async def _running_dev(
    state_dir: Path,
    client_port: int,
    environment: dict[str, str],
    *flags: str,
    admin_port: int | None = None,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``llmgw-dev`` on ``state_dir`` with listeners of its own, SIGINT at the end."""
    admin_port = free_port() if admin_port is None else admin_port
    process = await asyncio.create_subprocess_exec(
        *(DEV, "--state-dir", str(state_dir)),
        *("--admin-port", str(admin_port), "--agent-port", str(free_port())),
        *("--client-port", str(client_port), *flags),
        stdin=subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=environment,
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), STOP_WITHIN_S)
            except TimeoutError:
                process.kill()
                await process.wait()


async def test_dev_prints_next_steps_that_work_and_ctrl_c_leaves_no_process(
    dev: asyncio.subprocess.Process, state_dir: Path, client_port: int
) -> None:
    printed = await _read_until_next_steps(dev, START_WITHIN_S)
    steps = NextSteps.parse(printed)

    assert steps.curl_url == f"http://127.0.0.1:{client_port}/v1/chat/completions"
    assert steps.curl_headers["Authorization"].startswith("Bearer llmgw-")
    async with httpx.AsyncClient(timeout=10.0) as client:
        answer = await client.post(
            steps.curl_url, content=steps.curl_body, headers=steps.curl_headers
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["object"] == "chat.completion"
        admin_on_client_port = await client.get(
            f"http://127.0.0.1:{client_port}/admin/v1/nodes",
            headers={"authorization": f"Bearer {steps.environment['LLMGW_ADMIN_TOKEN']}"},
        )
        assert admin_on_client_port.status_code == 404, "the admin API leaks to clients"
        engine_pids = await _engine_pids(client, steps.environment)
    assert len(engine_pids) == 2

    history = await asyncio.to_thread(
        subprocess.run,
        steps.history,
        env={**os.environ, **steps.environment, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert history.returncode == 0, history.stderr
    assert "replica_placed" in history.stdout

    sdk = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", steps.sdk_snippet],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert sdk.returncode == 0, sdk.stderr
    assert sdk.stdout.strip(), "the SDK example printed no answer"

    assert steps.log_verify is not None, f"no command checks the log's chain:\n{printed}"
    verify = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", steps.log_verify],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.startswith("log verified: "), verify.stdout

    dev.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(dev.wait(), STOP_WITHIN_S) == 0
    await wait_until(lambda: not _processes_under(state_dir), within_s=5.0, what="no process")
    assert [pid for pid in engine_pids if is_running(pid)] == []


async def test_dev_on_llamacpp_answers_the_printed_curl_with_a_real_completion(
    real_engine: RealEngine, state_dir: Path, client_port: int, postgres_server: PostgresServer
) -> None:
    """``llmgw-dev --engine llamacpp``: the demo model served by two real ``llama-server``
    processes (the model already assembled in the cache by ``real_engine``); Ctrl-C leaves
    none running. The state directory then keeps llama.cpp: a run on the simulator is
    refused before any engine starts. The tests' PostgreSQL server spares an initdb."""
    database = unique_database_name("llmgw_dev")
    await postgres_server.create_database(database)
    environment = {**os.environ, "LLMGW_DATABASE_URL": postgres_server.url(database)}
    try:
        async with _running_dev(state_dir, client_port, environment, "--engine", "llamacpp") as dev:
            printed = await _read_until_next_steps(dev, START_ON_A_REAL_ENGINE_WITHIN_S)
            assert "demo, served by llama.cpp's llama-server with a real 270M" in printed
            steps = NextSteps.parse(printed)
            async with httpx.AsyncClient(timeout=60.0) as client:
                answer = await client.post(
                    steps.curl_url, content=steps.curl_body, headers=steps.curl_headers
                )
                assert answer.status_code == 200, answer.text
                engine_pids = await _engine_pids(client, steps.environment)
            completion = answer.json()
            assert completion["model"] == "demo"
            assert completion["choices"][0]["message"]["content"].strip()
            assert 0 < completion["usage"]["completion_tokens"] <= 128
            # "Hello!" in gemma's chat template: <start_of_turn> user \n Hello ! <end_of_turn>
            # \n <start_of_turn> model \n (a template taken for another would count otherwise)
            assert completion["usage"]["prompt_tokens"] == 11, completion["usage"]
            assert len(engine_pids) == 2
            for pid in engine_pids:
                command = _command_line(pid)
                assert command[:3] == [str(real_engine.server), "-m", str(real_engine.model)]

            dev.send_signal(signal.SIGINT)
            assert await asyncio.wait_for(dev.wait(), STOP_WITHIN_S) == 0
        await wait_until(lambda: not _processes_under(state_dir), within_s=5.0, what="no process")
        assert [pid for pid in engine_pids if is_running(pid)] == []

        agent_logs = _agent_log_sizes(state_dir)
        async with _running_dev(state_dir, client_port, environment) as simulator:
            refused = await asyncio.wait_for(_read_to_the_end(simulator), START_WITHIN_S)
            assert await simulator.wait() == 1
    finally:
        await postgres_server.drop_database(database)
    assert f"llmgw-dev: the demo model in {state_dir} was declared by an earlier run" in refused
    assert "on llama.cpp; to run the engine simulator" in refused
    assert _agent_log_sizes(state_dir) == agent_logs, "no agent, so no engine, was started"


async def test_the_next_dev_run_serves_the_same_replicas_and_the_log_says_why_they_stopped(
    state_dir: Path, client_port: int
) -> None:
    """Ctrl-C is a clean stop, not a loss: the agents report their engines stopped before
    they leave, and the next run starts those same replicas again, so the tour's replica
    names keep working."""
    environment = {k: v for k, v in os.environ.items() if k != "LLMGW_DATABASE_URL"}
    serving: list[list[str]] = []
    for _ in range(2):
        async with _running_dev(state_dir, client_port, environment) as dev:
            steps = NextSteps.parse(await _read_until_next_steps(dev, START_WITHIN_S))
            async with httpx.AsyncClient(timeout=10.0) as client:
                admin = _Admin(client, steps.environment)
                serving.append(await admin.replica_ids(phase="serving"))
                replicas = await admin.get("/admin/v1/replicas", model="demo")
                histories = {
                    replica_id: await admin.history(replica_id) for replica_id in serving[-1]
                }
            dev.send_signal(signal.SIGINT)
            assert await asyncio.wait_for(dev.wait(), STOP_WITHIN_S) == 0

    first, second = serving
    assert first == second == ["demo-1", "demo-2"]
    assert [(r["id"], r["phase"]) for r in replicas] == [
        ("demo-1", "serving"),
        ("demo-2", "serving"),
    ], "nothing lost, nothing placed again"
    for replica_id, history in histories.items():
        stops = [event for event in history if event["type"] == "shard_stopped"]
        assert len(stops) == 1, (replica_id, history)
        assert stops[0]["data"]["reason"] == "agent shutting down"
        assert stops[0]["actor"].startswith("agent:dev-node-")
        assert [e["type"] for e in history if e["type"] == "replica_lost"] == []
        after_stop = [e["type"] for e in history if e["position"] > stops[0]["position"]]
        assert after_stop == ["shard_starting", "shard_ready", "replica_serving"]


async def test_ctrl_c_stops_everything_when_the_reader_of_its_output_is_gone_first(
    state_dir: Path, client_port: int
) -> None:
    """``make dev | tee dev.log``, then Ctrl-C: the terminal's SIGINT ends ``tee`` too, so
    the lines that announce the stop meet a closed pipe. The stop must happen all the same:
    nothing of the cluster (engines, agents, server, PostgreSQL) may be left running."""
    environment = {k: v for k, v in os.environ.items() if k != "LLMGW_DATABASE_URL"}
    ports = ("--admin-port", str(free_port()), "--agent-port", str(free_port()))
    dev = await asyncio.to_thread(
        subprocess.Popen,
        [DEV, "--state-dir", str(state_dir), *ports, "--client-port", str(client_port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=environment,
    )
    try:
        assert dev.stdout is not None
        printed = await asyncio.wait_for(
            asyncio.to_thread(_read_lines_until, dev.stdout, LAST_LINE_OF_NEXT_STEPS),
            START_WITHIN_S,
        )
        steps = NextSteps.parse(printed)
        async with httpx.AsyncClient(timeout=10.0) as client:
            engine_pids = await _engine_pids(client, steps.environment)
        assert len(engine_pids) == 2

        dev.stdout.close()  # the reader goes first, as tee does
        dev.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(dev.wait, STOP_WITHIN_S)
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()

    assert code == 0
    await wait_until(lambda: not _processes_under(state_dir), within_s=5.0, what="no process")
    assert [pid for pid in engine_pids if is_running(pid)] == []


def _read_lines_until(stream: Any, last: str) -> str:
    printed: list[str] = []
    while not printed or last not in printed[-1]:
        line = stream.readline()
        if not line:
            raise AssertionError(f"dev exited before its next steps:\n{''.join(printed)}")
        printed.append(line.decode())
    return "".join(printed)


@dataclass(frozen=True)
class _Admin:
    """The admin API of a running dev cluster, with the token it printed."""

    client: httpx.AsyncClient
    environment: dict[str, str]

    async def get(self, path: str, **params: str) -> list[dict[str, Any]]:
        answer = await self.client.get(
            f"{self.environment['LLMGW_ADMIN_URL']}{path}",
            params=params,
            headers={"authorization": f"Bearer {self.environment['LLMGW_ADMIN_TOKEN']}"},
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        return body["events"] if isinstance(body, dict) else body

    async def replica_ids(self, **filters: str) -> list[str]:
        return sorted(r["id"] for r in await self.get("/admin/v1/replicas", **filters))

    async def history(self, replica_id: str) -> list[dict[str, Any]]:
        return await self.get(f"/admin/v1/history/replica/{replica_id}")


async def test_two_dev_clusters_on_one_machine_each_serve_from_engines_of_their_own(
    postgres_server: PostgresServer,
) -> None:
    """Each with its own state directory, listeners and database (on the tests' server,
    to spare a second PostgreSQL): their engines must never meet on a port."""
    databases = [unique_database_name("llmgw_dev") for _ in range(2)]
    for name in databases:
        await postgres_server.create_database(name)
    try:
        with _state_directory() as first_dir, _state_directory() as second_dir:
            clusters = [
                (first_dir, free_port(), databases[0]),
                (second_dir, free_port(), databases[1]),
            ]
            async with contextlib.AsyncExitStack() as stack:
                running = [
                    await stack.enter_async_context(
                        _running_dev(
                            directory,
                            port,
                            {**os.environ, "LLMGW_DATABASE_URL": postgres_server.url(database)},
                        )
                    )
                    for directory, port, database in clusters
                ]
                printed = await asyncio.gather(
                    *(_read_until_next_steps(dev, 2 * START_WITHIN_S) for dev in running)
                )
                engines = []
                async with httpx.AsyncClient(timeout=10.0) as client:
                    for steps in map(NextSteps.parse, printed):
                        answer = await client.post(
                            steps.curl_url, content=steps.curl_body, headers=steps.curl_headers
                        )
                        assert answer.status_code == 200, answer.text
                        engines.append(await _engine_shards(client, steps.environment))
                for dev in running:
                    dev.send_signal(signal.SIGINT)
                assert [await asyncio.wait_for(dev.wait(), STOP_WITHIN_S) for dev in running] == [
                    0,
                    0,
                ]
    finally:
        for name in databases:
            await postgres_server.drop_database(name)

    first, second = engines
    assert len(first) == len(second) == 2
    assert not {port for _, port in first} & {port for _, port in second}, engines
    assert not {pid for pid, _ in first} & {pid for pid, _ in second}, engines


async def test_an_admin_port_taken_after_dev_checked_it_is_not_taken_for_its_server(
    state_dir: Path, client_port: int, postgres_server: PostgresServer
) -> None:
    """Another llmgw server may bind the admin port between dev's check of it and its own
    server's start (two dev clusters started at once). That server answers ``/readyz``
    as a leader but refuses this cluster's token: dev must wait for its own server, which
    cannot listen and exits, and say so, rather than blame the token it never chose."""
    database = unique_database_name("llmgw_dev")
    await postgres_server.create_database(database)
    admin_port = free_port()
    environment = {**os.environ, "LLMGW_DATABASE_URL": postgres_server.url(database)}
    try:
        async with _running_dev(state_dir, client_port, environment, admin_port=admin_port) as dev:
            assert dev.stdout is not None
            first = (await asyncio.wait_for(dev.stdout.readline(), START_WITHIN_S)).decode()
            assert "preparing the database" in first, first
            other = await asyncio.start_server(_another_leader, "127.0.0.1", admin_port)
            async with other:
                printed = first + await asyncio.wait_for(_read_to_the_end(dev), START_WITHIN_S)
                assert await dev.wait() == 1, printed
    finally:
        await postgres_server.drop_database(database)

    assert "LLMGW_ADMIN_TOKEN" not in printed, printed
    assert f"server exited with code 1; see {state_dir / 'logs' / 'server.log'}" in printed
    server_log = (state_dir / "logs" / "server.log").read_text()
    assert str(admin_port) in server_log, server_log


async def _another_leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An admin API that leads and knows none of dev's tokens."""
    request_line = await reader.readline()
    while (await reader.readline()).strip():
        pass
    if b" /readyz " in request_line:
        status, body = "200 OK", b'{"ready": true, "role": "leader", "failing": []}'
    else:
        status, body = "401 Unauthorized", b'{"status": 401, "title": "Unauthorized"}'
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
    head += f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()
    writer.close()


async def _read_until_next_steps(dev: asyncio.subprocess.Process, within_s: float) -> str:
    """What ``dev`` printed up to its next steps; on a timeout or an early exit, an error
    that shows what it had printed, so a slow or stuck start says where it was."""
    assert dev.stdout is not None
    printed: list[str] = []

    async def read() -> None:
        assert dev.stdout is not None
        while not printed or LAST_LINE_OF_NEXT_STEPS not in printed[-1]:
            line = await dev.stdout.readline()
            if not line:
                raise AssertionError(f"dev exited before its next steps:\n{''.join(printed)}")
            printed.append(line.decode())

    try:
        await asyncio.wait_for(read(), within_s)
    except TimeoutError:
        raise AssertionError(
            f"no next steps within {within_s:.0f}s; dev had printed:\n{''.join(printed)}"
        ) from None
    return "".join(printed)


async def _read_to_the_end(dev: asyncio.subprocess.Process) -> str:
    assert dev.stdout is not None
    return (await dev.stdout.read()).decode()


async def _engine_pids(client: httpx.AsyncClient, environment: dict[str, str]) -> list[int]:
    return [pid for pid, _ in await _engine_shards(client, environment)]


async def _engine_shards(
    client: httpx.AsyncClient, environment: dict[str, str]
) -> list[tuple[int, int]]:
    """Pid and port of every shard of the serving replicas of ``demo``."""
    admin = environment["LLMGW_ADMIN_URL"]
    headers = {"authorization": f"Bearer {environment['LLMGW_ADMIN_TOKEN']}"}
    replicas = await client.get(
        f"{admin}/admin/v1/replicas", params={"model": "demo", "phase": "serving"}, headers=headers
    )
    shards: list[tuple[int, int]] = []
    for replica in replicas.json():
        detail = await client.get(f"{admin}/admin/v1/replicas/{replica['id']}", headers=headers)
        shards += [(shard["pid"], shard["port"]) for shard in detail.json()["shards"]]
    return shards


def _command_line(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _agent_log_sizes(state_dir: Path) -> dict[str, int]:
    """The agents' logs, which every run appends to."""
    return {log.name: log.stat().st_size for log in (state_dir / "logs").glob("dev-node-*.log")}


def _processes_under(directory: Path) -> list[str]:
    """Command lines of live processes (llmgw-agent, llmgw-server, postgres) that name it."""
    found: list[str] = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                command = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode()
                if str(directory) in command and is_running(int(proc.name)):
                    found.append(command)
    return found


def _kill_everything_under(directory: Path) -> None:
    """After a failed test: the engines the agents recorded, then whatever names the dir."""
    for shards in directory.glob("agents/*"):
        for record in RecordStore(shards).load_all():
            if is_same_process(record):
                kill_group(record.pid)
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if str(directory).encode() in proc.joinpath("cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
