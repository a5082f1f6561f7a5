"""An operator at a live admin API: the Litestar app served by uvicorn on a loopback port in
the test's event loop, over a real PostgreSQL store, and the installed ``llmgw-cli`` run as
a subprocess against it. Nodes and replicas are seeded through the store, as the agent hub
and the reconciler record them."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from app.admin.app import create_admin_app
from app.admin.auth import TokenAuthenticator
from app.admin.events import end_event_streams
from app.domain.envelope import Meta
from app.domain.events import (
    AnyEvent,
    GpuInfo,
    NodeConnected,
    NodeRegistered,
    ReplicaPlaced,
    ReplicaServing,
    ShardPlacement,
    node_stream,
    replica_stream,
)
from app.store.interface import NewEvent
from app.store.postgres import PostgresEventStore
from tests.support.waiting import wait_until

OPERATOR = "alice"
TOKEN = secrets.token_hex(16)
LOOPBACK = "127.0.0.1"
CLI_TIMEOUT_S = 60.0
SHUTDOWN_GRACE_S = 2
"""As ``llmgw-server serve``: requests still going on this long after the stop are cut."""


def installed(script: str) -> str:
    beside_python = Path(sys.executable).parent / script
    found = str(beside_python) if beside_python.exists() else shutil.which(script)
    assert found, f"{script} is not installed (pip install -e .)"
    return found


def clean_environment(**settings: str) -> dict[str, str]:
    """This process's environment without any llmgw setting, plus ``settings``."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("LLMGW_") and key != "XDG_CONFIG_HOME"
    } | settings


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        assert self.code == 0, f"exit {self.code}: {self.stderr}"
        return json.loads(self.stdout)


@dataclass(frozen=True)
class Operator:
    """Runs ``llmgw-cli`` from a scratch home with the admin API's URL and the token."""

    home: Path
    admin_url: str
    token: str = TOKEN

    def environment(self, **extra: str) -> dict[str, str]:
        return clean_environment(
            HOME=str(self.home),
            COLUMNS="200",
            LLMGW_ADMIN_URL=self.admin_url,
            LLMGW_ADMIN_TOKEN=self.token,
            **extra,
        )

    async def run(self, *args: str, **extra_env: str) -> Result:
        process = await self.start(*args, **extra_env)
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), CLI_TIMEOUT_S)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode is not None
        return Result(process.returncode, stdout.decode(), stderr.decode())

    async def start(self, *args: str, **extra_env: str) -> asyncio.subprocess.Process:
        """``llmgw-cli args...`` running, its output piped (for commands that keep going)."""
        return await asyncio.create_subprocess_exec(
            installed("llmgw-cli"),
            *args,
            cwd=self.home,
            env=self.environment(**extra_env),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )


class OnTerminal:
    """``llmgw-cli`` with a terminal for its output (a pseudo-terminal the test reads), as
    an operator at a shell sees it."""

    def __init__(self, process: subprocess.Popen[bytes], terminal: int) -> None:
        self._process = process
        self._terminal = terminal
        self._output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, operator: Operator, *args: str) -> OnTerminal:
        terminal, screen = pty.openpty()
        process = subprocess.Popen(
            [installed("llmgw-cli"), *args],
            cwd=operator.home,
            env=operator.environment(TERM="xterm-256color"),
            stdin=subprocess.DEVNULL,
            stdout=screen,
            stderr=screen,
        )
        os.close(screen)
        return cls(process, terminal)

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._terminal, 65536)
            except OSError:  # EIO: the process closed its end
                return
            if not chunk:
                return
            self._output.extend(chunk)

    def text(self) -> str:
        """Everything written so far, without terminal control sequences."""
        return ANSI_CONTROL.sub("", self._output.decode(errors="replace"))

    async def exit_code(self) -> int:
        code = await asyncio.to_thread(self._process.wait, CLI_TIMEOUT_S)
        await asyncio.to_thread(self._reader.join, CLI_TIMEOUT_S)
        os.close(self._terminal)
        return code

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


ANSI_CONTROL = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07|[()][A-Z0-9])")


@asynccontextmanager
async def live_admin_api(store: PostgresEventStore, port: int | None = None) -> AsyncIterator[str]:
    """The admin API over ``store`` until the block ends; its URL."""
    app = create_admin_app(store, TokenAuthenticator({TOKEN: OPERATOR}))
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LOOPBACK, port or 0))
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
    )
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await wait_until(lambda: server.started, within_s=10, what="admin API listening")
        yield f"http://{LOOPBACK}:{listener.getsockname()[1]}"
    finally:
        end_event_streams(app)
        server.should_exit = True
        await serving
        listener.close()


# -- seeding the log as agents and the reconciler would ----------------------------------


def gpu(index: int, **health: Any) -> GpuInfo:
    return GpuInfo(index=index, uuid=f"GPU-{index}", name="H100", memory_total_mib=81559, **health)


async def record(
    store: PostgresEventStore, actor: str, *events: AnyEvent, correlation_id: str | None = None
) -> None:
    meta = Meta(actor=actor, correlation_id=correlation_id)
    for event in events:
        await store.append(_stream_of(event), None, [NewEvent(event)], meta)


def _stream_of(event: AnyEvent) -> str:
    if (replica_id := getattr(event, "replica_id", None)) is not None:
        return replica_stream(replica_id)
    return node_stream(getattr(event, "node_id", ""))


async def seed_node(
    store: PostgresEventStore,
    node_id: str,
    gpus: tuple[GpuInfo, ...] = (gpu(0), gpu(1)),
    labels: dict[str, str] | None = None,
) -> None:
    address = "10.0.0.7"
    await record(
        store,
        f"agent:{node_id}",
        NodeRegistered(node_id=node_id, address=address, gpus=gpus, labels=labels or {}),
        NodeConnected(
            node_id=node_id, address=address, gpus=gpus, labels=labels or {}, agent_version="0.1"
        ),
    )


async def seed_serving_replica(
    store: PostgresEventStore, replica_id: str, node_id: str, gpu_index: int = 0
) -> None:
    model, number = replica_id.rsplit("-", 1)
    shard = ShardPlacement(index=0, node_id=node_id, gpus=(gpu_index,), port=20000 + gpu_index)
    await record(
        store,
        "reconciler",
        ReplicaPlaced(replica_id=replica_id, model=model, number=int(number), shards=(shard,)),
        ReplicaServing(replica_id=replica_id),
    )
