"""``llmgw-agent``: the node agent, from its flags to the running connection
(``agent.connection``) and runtime (``agent.runtime``); its subcommands ``fake-gpu``
(``agent.fake_gpu_commands``) and ``stop-engines`` (``agent.stop_engines_command``) are
added to its app here.

Settings come from flags, then ``LLMGW_AGENT_*`` variables, then the TOML file named by
``--config`` (or ``$LLMGW_AGENT_CONFIG``), then defaults; docs/agent.md lists them all.

Exit codes: 0 stopped by SIGTERM or SIGINT (engines are left running, or stopped and
reported with ``--engines-on-exit stop``), 1 cannot go on (a certificate refused by either
side, the state directory in use or unwritable), 2 bad usage or configuration, or more
GPUs than a node may report (``agent.gpu_limit``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Annotated

import structlog
from cyclopts import App, Parameter

from agent.command_line import (
    ENGINE_STOP_GRACE_S,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    StateDir,
    fail,
)
from agent.config import AgentConfig, AgentSettings
from agent.config_sources import load_config
from agent.config_values import ConfigError, EnginesOnExit, parse_labels
from agent.connection import Backoff, ConnectionFatal, DialTimeouts, stay_connected
from agent.fake_gpu_commands import fake_gpu_app
from agent.flag_converters import FlagRefused, filled_path
from agent.gpu_limit import GpusOverLimit
from agent.gpus import open_gpu_source
from agent.refusal_advice import NodeClaim
from agent.runtime import AgentRuntime
from agent.state_dir import StateDirBusy, lock_state_dir, unusable_state_dir
from agent.stop_engines_command import stop_engines
from app.logs import configure_logging
from app.pki.errors import CertificateFileError, CertificateNotYetValid, TlsConfigurationError
from app.pki.files import load_certificate
from app.pki.tls import client_ssl_context
from app.usage_errors import (
    finite_number_flag,
    one_line_usage_errors,
    output_console,
    run_program,
    usage_error_console,
    whole_number_flag,
)
from wire.version import llmgw_version

# The command as typed: the start of every error line it ends with, as of its usage errors.
PROGRAM = "llmgw-agent"
SHUTDOWN_REASON = "agent shutting down"

log = structlog.get_logger("llmgw.agent")

app = App(
    name=PROGRAM,
    help="""The llmgw node agent: reports this machine's GPUs and runs the engine shards the \
control plane asks for, until SIGTERM or SIGINT.

Each setting comes from its flag, else its LLMGW_AGENT_* variable (--node-id: \
LLMGW_AGENT_NODE_ID; --server and --label: LLMGW_AGENT_SERVERS and LLMGW_AGENT_LABELS, \
comma-separated), else the TOML file of --config, else its default (docs/agent.md).

Exit codes: 0 after SIGTERM or SIGINT; 1 a fatal connection failure, or a state directory \
it cannot use or that another agent holds; 2 bad usage or configuration (a certificate it \
cannot use included). Each is said in one line on stderr.

```
llmgw-agent --server wss://10.0.0.5:8443 --node-id gpu-07 \\
    --cert node-gpu-07.crt --key node-gpu-07.key --ca ca.crt
llmgw-agent --config /etc/llmgw/agent.toml
```
""",
    version=llmgw_version,
    error_formatter=one_line_usage_errors(PROGRAM, refusals=(FlagRefused,)),
    error_console=usage_error_console(),
    console=output_console(),
)
app.command(fake_gpu_app)
app.command(stop_engines, name="stop-engines")


@app.default
def run(
    *,
    server: Annotated[
        list[str] | None,
        Parameter(help="Control plane to dial, wss://HOST:PORT; repeat for several.", negative=()),
    ] = None,
    node_id: Annotated[
        str | None, Parameter(help="This node's id: the common name of its certificate.")
    ] = None,
    cert: Annotated[
        Path | None, Parameter(converter=filled_path, help="The node certificate (PEM).")
    ] = None,
    key: Annotated[
        Path | None, Parameter(converter=filled_path, help="The node certificate's private key.")
    ] = None,
    ca: Annotated[
        Path | None, Parameter(converter=filled_path, help="The llmgw CA certificate (ca.crt).")
    ] = None,
    fake_gpus: Annotated[
        str | None,
        Parameter(
            help="Declare fake GPUs instead of using NVML, e.g. 4x80GB; at most 64, the most "
            "a node may report (an agent whose NVML lists more refuses to start too)."
        ),
    ] = None,
    state_dir: StateDir = None,
    label: Annotated[
        list[str] | None,
        Parameter(
            help="A node label, key=value; repeat for several. At most 64, each key 1-63 "
            "characters and each value at most 256, as a hello carries them.",
            negative=(),
        ),
    ] = None,
    address: Annotated[
        str | None,
        Parameter(
            help="Host or IP at which engines on this node are reachable; the node's "
            "certificate must name it (`llmgw-cli cert node --host/--ip`) unless it is the "
            "address the agent connects from. [default: the address it connects from]"
        ),
    ] = None,
    port_range: Annotated[
        str | None, Parameter(help="Ports engines may use, LO-HI. [default: 20000-20999]")
    ] = None,
    log_level: Annotated[
        str | None, Parameter(help="debug, info, warning or error. [default: info]")
    ] = None,
    reconnect_max_delay: Annotated[
        float | None,
        Parameter(
            converter=finite_number_flag,
            help="The longest wait in seconds between connection attempts. [default: 30]",
        ),
    ] = None,
    connect_timeout: Annotated[
        float | None,
        Parameter(
            converter=finite_number_flag,
            help="Seconds a TCP connect to a control plane may take before the next server "
            "is tried. [default: 5]",
        ),
    ] = None,
    open_timeout: Annotated[
        float | None,
        Parameter(
            converter=finite_number_flag,
            help="Seconds the TLS handshake and WebSocket upgrade may take once TCP is "
            "connected; long, since a restarted control plane is dialled by every agent at "
            "once. [default: 30]",
        ),
    ] = None,
    next_server_after: Annotated[
        float | None,
        Parameter(
            converter=finite_number_flag,
            help="With several --server: seconds a dial may go without its connection "
            "opening before the next server is dialled too. The slow dial goes on (the first "
            "to open wins), so a frozen control plane, whose kernel still accepts TCP, costs "
            "this rather than --open-timeout. [default: 5]",
        ),
    ] = None,
    engines_on_exit: Annotated[
        EnginesOnExit | None,
        Parameter(
            help="What SIGTERM or SIGINT does to the engines: keep (they run on, so an agent "
            "upgrade or restart costs no engine) or stop (stop each, report the stops, then "
            "disconnect). [default: keep]"
        ),
    ] = None,
    liveness_interval: Annotated[
        float | None,
        Parameter(
            converter=finite_number_flag,
            help="Seconds between the starts of two health checks of a serving engine (GET "
            "/health for vLLM, SGLang and llama.cpp), and the most one may take; 0 checks "
            "nothing. An engine dead behind its HTTP server (vLLM's, once its engine core "
            "died, answers 503) is ended and reported failed, so the control plane replaces it. "
            "[default: 10]",
        ),
    ] = None,
    liveness_failures: Annotated[
        int | None,
        Parameter(
            converter=whole_number_flag,
            help="Health checks missed in a row that end a serving engine. [default: 3]",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        Parameter(
            converter=filled_path, help="A TOML file of settings. [default: $LLMGW_AGENT_CONFIG]"
        ),
    ] = None,
) -> int:
    """Connect to the control plane and run engines until SIGTERM or SIGINT (the app's
    help, shown by ``llmgw-agent --help``, says how)."""
    try:
        flags = AgentSettings(
            servers=tuple(server) if server else None,
            node_id=node_id,
            cert=cert,
            key=key,
            ca=ca,
            fake_gpus=fake_gpus,
            state_dir=state_dir,
            labels=parse_labels(label) if label else None,
            address=address,
            port_range=port_range,
            log_level=log_level,
            reconnect_max_delay=reconnect_max_delay,
            connect_timeout=connect_timeout,
            open_timeout=open_timeout,
            next_server_after=next_server_after,
            engines_on_exit=engines_on_exit,
            liveness_interval=liveness_interval,
            liveness_failures=liveness_failures,
        )
        settings = load_config(flags, os.environ, config)
    except ConfigError as exc:
        return fail(PROGRAM, str(exc), EXIT_USAGE)
    configure_logging(settings.log_level, command=PROGRAM)
    return asyncio.run(run_agent(settings))


async def run_agent(config: AgentConfig) -> int:
    """Run until a signal (0) or a fatal connection failure (1). Engines are left running."""
    try:
        ssl_context = client_ssl_context(config.ca, config.cert, config.key)
    except CertificateNotYetValid as exc:
        # Not bad configuration: a machine that booted before its clock was set, or a
        # certificate issued by a clock a little ahead, is fixed by time alone, and a
        # supervisor must try again (exit 2 tells it not to).
        return fail(PROGRAM, str(exc), EXIT_FAILED)
    except TlsConfigurationError as exc:
        return fail(PROGRAM, str(exc), EXIT_USAGE)
    try:
        lock = lock_state_dir(config.state_dir)
    except StateDirBusy as exc:
        return fail(PROGRAM, str(exc), EXIT_FAILED)
    except OSError as exc:
        return fail(PROGRAM, unusable_state_dir(config.state_dir, exc), EXIT_FAILED)
    # One node per agent process: every line it logs names it.
    with lock, structlog.contextvars.bound_contextvars(node_id=config.node_id):
        return await _run_locked(config, ssl_context)


async def _run_locked(config: AgentConfig, ssl_context: ssl.SSLContext) -> int:
    gpu_source = open_gpu_source(config.fake_gpus, config.fake_gpu_health_file, config.node_id)
    runtime = AgentRuntime(config, gpu_source)
    try:
        try:
            await runtime.start()
        except GpusOverLimit as exc:
            return fail(PROGRAM, str(exc), EXIT_USAGE)
        return await _serve_until_stopped(config, ssl_context, runtime)
    finally:
        await runtime.close()


async def _serve_until_stopped(
    config: AgentConfig, ssl_context: ssl.SSLContext, runtime: AgentRuntime
) -> int:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    backoff = Backoff(cap_s=config.reconnect_max_delay_s)
    connection = asyncio.create_task(
        stay_connected(
            config.servers,
            ssl_context,
            runtime.serve,
            node=NodeClaim(config.node_id, config.address, _validity(config.cert)),
            backoff=backoff,
            timeouts=DialTimeouts(
                connect_s=config.connect_timeout_s,
                open_s=config.open_timeout_s,
                next_server_after_s=config.next_server_after_s,
            ),
        )
    )
    gpu_watch = asyncio.create_task(runtime.watch_gpus())
    stop = asyncio.create_task(stopping.wait())
    try:
        await asyncio.wait({connection, stop}, return_when=asyncio.FIRST_COMPLETED)
        if connection.done():
            error = connection.exception()
            if isinstance(error, ConnectionFatal):
                log.error("cannot_connect", error=str(error))
                return fail(PROGRAM, str(error), EXIT_FAILED)
            await connection  # any other ending is a bug: let it raise
        if config.engines_on_exit == "stop":
            stopped = await runtime.stop_engines(SHUTDOWN_REASON, ENGINE_STOP_GRACE_S)
            log.info("agent_stopping", engines_stopped=stopped)
        else:
            log.info("agent_stopping", engines_left_running=len(runtime.supervisor.inventory()))
        return EXIT_OK
    finally:
        for task in (connection, gpu_watch, stop):
            task.cancel()
        await asyncio.gather(connection, gpu_watch, stop, return_exceptions=True)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def main() -> None:
    with suppress(KeyboardInterrupt):
        run_program(app)


def _validity(certificate_path: Path) -> tuple[datetime, datetime] | None:
    """The node certificate's not_before and not_after, to name in a refusal; None if it
    cannot be read again (TLS has loaded it already)."""
    try:
        certificate = load_certificate(certificate_path)
    except CertificateFileError:
        return None
    return certificate.not_valid_before_utc, certificate.not_valid_after_utc
