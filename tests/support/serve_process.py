"""``llmgw-server serve`` as a process of its own, the way an operator starts it: its admin
API on a free loopback port with one token, the test CA's certificates for its agent hub
(and for the admin API too, when asked), its output in a log file, connected as the runtime
role. No gateway runs unless asked for (on ``gateway_port``), and no agent connects. It is
started and stopped by ``devcluster``'s orchestrator."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from devcluster.orchestrator import Processes, ServerProcess
from devcluster.pki import ClusterPki
from devcluster.programs import ServeCommand
from devcluster.readiness import answers
from tests.support.admin_server import Pki
from tests.support.databases import runtime_url
from tests.support.ports import free_port
from tests.support.waiting import wait_until

START_WITHIN_S = 30
STOP_WAIT_S = 10


@asynccontextmanager
async def serving_process(
    database_url: str,
    pki: Pki,
    log: Path,
    *,
    token_name: str,
    token: str,
    admin_tls: bool,
    as_owner: bool = False,
    flags: Sequence[str] = (),
    gateway_port: int | None = None,
    agent_port: int | None = None,
) -> AsyncIterator[str]:
    """``llmgw-server serve`` over ``database_url`` until the block ends, however it ends;
    yields its admin API's URL once ``/healthz`` answers there (HTTPS with ``admin_tls``).
    It connects as the runtime role, or with ``as_owner`` as ``database_url`` says. With
    ``gateway_port``, its gateway serves clients there; its agent hub listens on
    ``agent_port`` (a free port unless given) once it leads."""
    command = ServeCommand(
        pki=ClusterPki(pki.directory),
        admin_port=free_port(),
        agent_port=agent_port if agent_port is not None else free_port(),
        client_port=gateway_port,
        database_url=database_url if as_owner else runtime_url(database_url),
        admin_tokens=((token_name, token),),
        admin_tls=admin_tls,
        flags=tuple(flags),
    )
    server = Processes(log.parent).start_server("llmgw-server", command, log_path=log)
    try:
        await _wait_until_healthy(server, pki.client_context() if admin_tls else True)
        yield command.admin_url
    finally:
        await asyncio.to_thread(server.terminate, STOP_WAIT_S)


async def _wait_until_healthy(server: ServerProcess, verify: ssl.SSLContext | bool) -> None:
    async def answering() -> bool:
        if server.exited():
            code = server.process.returncode
            raise AssertionError(f"llmgw-server exited with {code}:\n{tail(server.log_path)}")
        return await asyncio.to_thread(answers, f"{server.admin_url}/healthz", verify=verify)

    what = f"llmgw-server on {server.admin_url}/healthz; see {server.log_path}"
    await wait_until(answering, within_s=START_WITHIN_S, every_s=0.1, what=what)


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
