"""`llmgw-cli cert revoke --node gpu-07 ...; llmgw-cli cert node gpu-07` from a machine whose
clock is behind the server's: the replacement is issued after the revocation by the
revocation's own time, so the agent hub lets it in, as docs/certificates.md promises.
The CLI runs as the operator runs it (the console script, a process of its own) against
the admin API on a loopback socket over PostgreSQL; the server's clock runs ahead."""

from __future__ import annotations

import secrets
import socket
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from app.clock import utc_now
from app.domain.revocations import PresentedCertificate, revocation_refusal
from app.pki.describe import serial_hex
from app.pki.files import load_certificate
from app.pki.model import CLOCK_SKEW
from app.store.postgres import PostgresEventStore
from tests.support.admin_server import serving_admin
from tests.support.operator_cli import OPERATOR, TOKEN, finished, run_cli, start_cli
from tests.support.ports import free_port

SERVER_AHEAD = timedelta(seconds=40)
"""How far the server's clock runs ahead of the operator's machine: within the minute
the event log allows an append's time to stray from the database's clock."""
LOOKUP_WITHIN_S = 3
"""The most `cert node` waits for the admin API, as docs/certificates.md says."""


async def test_a_replacement_issued_behind_the_server_s_clock_is_not_revoked_with_the_rest(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    store = PostgresEventStore(engine, clock=lambda: utc_now() + SERVER_AHEAD)
    node = f"gpu-{secrets.token_hex(3)}"
    async with serving_admin(store, tokens={TOKEN: OPERATOR}) as url:
        settings = {"LLMGW_ADMIN_URL": url, "LLMGW_ADMIN_TOKEN": TOKEN}

        async def cli(*args: str) -> str:
            done = await run_cli("cert", *args, home=tmp_path, settings=settings)
            assert done.code == 0, done.stderr
            return done.stderr

        await cli("init-ca", "--dir", "ca")
        await cli("node", node, "--dir", "ca")
        await cli("revoke", "--node", node, "--reason", "machine rebuilt")
        said = await cli("node", node, "--dir", "ca", "--force")
        state = await store.catch_up()

    assert said == ""
    replacement = load_certificate(tmp_path / "ca" / f"node-{node}.crt")
    presented = PresentedCertificate(
        common_name=node,
        serial=serial_hex(replacement),
        issued_at=replacement.not_valid_before_utc + CLOCK_SKEW,
    )
    assert revocation_refusal(state.revocations, presented) is None


async def test_without_the_admin_api_it_is_issued_by_this_machine_s_clock_and_says_so(
    tmp_path: Path,
) -> None:
    settings = {"LLMGW_ADMIN_URL": f"http://127.0.0.1:{free_port()}"}

    async def cli(*args: str) -> str:
        done = await run_cli("cert", *args, home=tmp_path, settings=settings)
        assert done.code == 0, done.stderr
        return done.stderr

    await cli("init-ca", "--dir", "ca")
    asked = await cli("node", "gpu-07", "--dir", "ca")
    offline = await cli("node", "gpu-08", "--dir", "ca", "--offline")

    assert asked.startswith(
        "llmgw-cli cert node: the admin API did not say when node gpu-07's certificates were last "
        "revoked ("
    ), asked
    assert asked.endswith("); issued by this machine's clock (--offline: do not ask)\n")
    assert offline == ""
    for node in ("gpu-07", "gpu-08"):
        assert (tmp_path / "ca" / f"node-{node}.crt").is_file()


async def test_an_admin_api_host_that_never_answers_holds_the_issue_only_briefly(
    tmp_path: Path,
) -> None:
    """A listener that takes the connection and never answers (a host that drops the
    packets, a stalled proxy): the issue waits the short lookup bound, not a request's."""
    settings = {"LLMGW_ADMIN_URL": "http://127.0.0.1:1"}
    assert (
        await run_cli("cert", "init-ca", "--dir", "ca", home=tmp_path, settings=settings)
    ).code == 0
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        settings = {"LLMGW_ADMIN_URL": f"http://127.0.0.1:{silent.getsockname()[1]}"}
        started = time.monotonic()
        process = await start_cli(
            "cert", "node", "gpu-07", "--dir", "ca", home=tmp_path, settings=settings
        )
        code, _, said = await finished(process, 60)
        took = time.monotonic() - started

    assert took < LOOKUP_WITHIN_S + 5, f"took {took:.1f} s"
    assert code == 0, said
    assert f"no answer within {LOOKUP_WITHIN_S:g} s" in said, said
    assert said.endswith("); issued by this machine's clock (--offline: do not ask)\n"), said
    assert (tmp_path / "ca" / "node-gpu-07.crt").is_file()
