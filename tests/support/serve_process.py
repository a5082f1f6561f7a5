"""``llmgw-server serve`` as a process of its own, the way an operator starts it: its admin
API on a free loopback port with one token, the test CA's certificates for its agent hub
(and for the admin API too, when asked), its output in a log file, connected as the runtime
role. No gateway runs unless asked for (on ``gateway_port``), and no agent connects."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from agent.simulator.launcher import free_port
from tests.support.admin_server import LOOPBACK, Pki
from tests.support.databases import runtime_url
from tests.support.operator_cli import clean_environment, installed
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
) -> AsyncIterator[str]:
    """``llmgw-server serve`` over ``database_url`` until the block ends, however it ends;
    yields its admin API's URL once ``/healthz`` answers there (HTTPS with ``admin_tls``).
    It connects as the runtime role, or with ``as_owner`` as ``database_url`` says. With
    ``gateway_port``, its gateway serves clients there."""
    port = free_port()
    admin = ["--admin-port", str(port), "--admin-tokens", f"{token_name}:{token}", *flags]
    if gateway_port is None:
        admin.append("--no-gateway")
    else:
        admin += ["--client-host", LOOPBACK, "--client-port", str(gateway_port)]
    if admin_tls:
        certificate, key = pki.pair("server")
        admin += ["--admin-tls-cert", str(certificate), "--admin-tls-key", str(key)]
    process = _start(database_url if as_owner else runtime_url(database_url), pki, log, admin)
    url = f"{'https' if admin_tls else 'http'}://{LOOPBACK}:{port}"
    try:
        await _wait_until_healthy(process, url, log, pki.client_context() if admin_tls else True)
        yield url
    finally:
        _stop(process)


def _start(
    database_url: str, pki: Pki, log: Path, admin_flags: list[str]
) -> subprocess.Popen[bytes]:
    certificate, key = pki.pair("server")
    with log.open("wb") as output:
        return subprocess.Popen(
            [
                installed("llmgw-server"),
                "serve",
                *("--database-url", database_url),
                *admin_flags,
                *("--agent-host", LOOPBACK, "--agent-port", str(free_port())),
                *("--engine-networks", "127.0.0.0/8"),
                *("--tls-cert", str(certificate), "--tls-key", str(key), "--tls-ca", str(pki.ca)),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=clean_environment(),
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def _wait_until_healthy(
    process: subprocess.Popen[bytes], url: str, log: Path, verify: ssl.SSLContext | bool
) -> None:
    async def answering() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"llmgw-server exited with {process.returncode}:\n{tail(log)}")
        try:
            async with httpx.AsyncClient(verify=verify) as client:
                return (await client.get(f"{url}/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    what = f"llmgw-server on {url}/healthz; see {log}"
    await wait_until(answering, within_s=START_WITHIN_S, every_s=0.1, what=what)


def tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
