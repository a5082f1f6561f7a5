"""``llmgw-agent``: the node agent; ``llmgw-agent fake-gpu`` to mark fake GPUs unhealthy or
say how much of their memory other processes use;
``llmgw-agent stop-engines`` to stop the engines a stopped agent left running.

Settings come from flags, then ``LLMGW_AGENT_*`` variables, then the TOML file named by
``--config`` (or ``$LLMGW_AGENT_CONFIG``), then defaults; docs/agent.md lists them all.

Exit codes: 0 stopped by SIGTERM or SIGINT (engines are left running, or stopped and
reported with ``--engines-on-exit stop``), 1 cannot go on (a certificate refused by either
side, the state directory in use or unwritable), 2 bad usage or configuration, or more
GPUs than a node may report (``agent.gpu_limit``).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import signal
import ssl
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Annotated, TextIO

import structlog
from cyclopts import App, Parameter

from agent.config import AgentConfig, AgentSettings, default_state_dir, fake_gpu_health_file
from agent.config_sources import filled_variable, load_config
from agent.config_values import ConfigError, EnginesOnExit, parse_labels
from agent.connection import Backoff, ConnectionFatal, DialTimeouts, stay_connected
from agent.engines.recorded_stop import stop_recorded_engines
from agent.engines.records import RecordStore
from agent.flag_converters import (
    FlagRefused,
    filled_path,
    filled_paths,
    gpu_index,
    mebibytes,
)
from agent.gpu_limit import GpusOverLimit
from agent.gpus import mark_fake_gpu, open_gpu_source
from agent.gpus.fake_memory import memory_file_beside, use_fake_gpu_memory
from agent.refusal_advice import NodeClaim
from agent.runtime import AgentRuntime
from app.logs import configure_logging
from app.pki import (
    CertificateFileError,
    CertificateNotYetValid,
    TlsConfigurationError,
    client_ssl_context,
)
from app.pki.files import load_certificate
from app.regular_file import not_a_directory, open_regular_to_append
from app.usage_errors import (
    finite_number_flag,
    one_line_usage_errors,
    output_console,
    print_command_error,
    run_program,
    usage_error_console,
    whole_number_flag,
)
from wire.version import llmgw_version

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
# Each command as typed: the start of every error line it ends with, as of its usage errors.
PROGRAM = "llmgw-agent"
STOP_ENGINES = "llmgw-agent stop-engines"
LOCK_FILE = "agent.lock"
STATE_DIR_ENV = "LLMGW_AGENT_STATE_DIR"
SHUTDOWN_REASON = "agent shutting down"
ENGINE_STOP_GRACE_S = 10.0
"""What an engine gets between SIGTERM and SIGKILL when the agent stops it on exit."""

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
fake_gpu_app = App(
    name="fake-gpu",
    help="""Mark fake GPUs (--fake-gpus) unhealthy or healthy again, or say how much of
their memory other processes use, while the agent runs.

```
llmgw-agent fake-gpu mark --gpu 0 --reason "XID 79: GPU has fallen off the bus"
llmgw-agent fake-gpu clear --gpu 0
llmgw-agent fake-gpu use --gpu 0 --mib 30000
```
""",
)
app.command(fake_gpu_app)

StateDir = Annotated[
    Path | None,
    Parameter(
        converter=filled_path,
        help="Shard records, engine logs, the fake GPU health file. [default: "
        "$LLMGW_AGENT_STATE_DIR, else /var/lib/llmgw-agent for root, else "
        "$XDG_STATE_HOME/llmgw-agent]",
    ),
]

FakeGpuIndex = Annotated[
    int,
    Parameter(
        converter=gpu_index,
        help="Index of the fake GPU; one the agent did not declare is refused.",
    ),
]


class StateDirBusy(Exception):
    """Another agent process holds the state directory."""


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
        return _fail(PROGRAM, str(exc), EXIT_USAGE)
    configure_logging(settings.log_level, command=PROGRAM)
    return asyncio.run(run_agent(settings))


@fake_gpu_app.command
def mark(
    *,
    gpu: FakeGpuIndex,
    reason: Annotated[
        str,
        Parameter(help='Why it is unhealthy, e.g. "XID 79"; printable, at most 500 characters.'),
    ],
    state_dir: StateDir = None,
) -> int:
    """Mark a fake GPU unhealthy; the running agent reports it within a few seconds.

    ```
    llmgw-agent fake-gpu mark --gpu 1 --reason "XID 79" --state-dir .llmgw/dev/agents/dev-node-1
    ```
    """
    return _mark("llmgw-agent fake-gpu mark", state_dir, gpu, reason)


@fake_gpu_app.command
def clear(
    *,
    gpu: Annotated[int, Parameter(converter=gpu_index, help="Index of the fake GPU.")],
    state_dir: StateDir = None,
) -> int:
    """Mark a fake GPU healthy again; entries of the file that are not a mark are dropped.

    ```
    llmgw-agent fake-gpu clear --gpu 1 --state-dir .llmgw/dev/agents/dev-node-1
    ```
    """
    return _mark("llmgw-agent fake-gpu clear", state_dir, gpu, None)


@fake_gpu_app.command
def use(
    *,
    gpu: FakeGpuIndex,
    mib: Annotated[
        int,
        Parameter(
            converter=mebibytes,
            help="MiB of its memory other processes use from now on; 0 frees it.",
        ),
    ],
    state_dir: StateDir = None,
) -> int:
    """Say how much of a fake GPU's memory other processes use; the running agent reports
    it with a heartbeat within a few seconds, and placement counts it as used.

    ```
    llmgw-agent fake-gpu use --gpu 0 --mib 30000 --state-dir .llmgw/dev/agents/dev-node-1
    llmgw-agent fake-gpu use --gpu 0 --mib 0 --state-dir .llmgw/dev/agents/dev-node-1
    ```
    """
    command = "llmgw-agent fake-gpu use"
    if gpu < 0:
        return _fail(command, f"--gpu {gpu}: a GPU index is 0 or more", EXIT_USAGE)
    if mib < 0:
        return _fail(command, f"--mib {mib}: MiB used is 0 or more", EXIT_USAGE)
    directory = _fake_gpu_state_dir(command, state_dir)
    if isinstance(directory, int):
        return directory
    memory_file = memory_file_beside(fake_gpu_health_file(directory))
    return _rewrite_fake_gpu_file(
        command, memory_file, lambda: use_fake_gpu_memory(memory_file, gpu, mib)
    )


@app.command(name="stop-engines")
def stop_engines(
    *,
    state_dir: Annotated[
        list[Path] | None,
        Parameter(
            converter=filled_paths,
            help="A state directory whose engines to stop; repeat for several. [default: "
            "$LLMGW_AGENT_STATE_DIR, else /var/lib/llmgw-agent for root, else "
            "$XDG_STATE_HOME/llmgw-agent]",
            negative=(),
        ),
    ] = None,
    grace: Annotated[
        float,
        Parameter(
            converter=finite_number_flag, help="Seconds from SIGTERM to SIGKILL; 0 kills at once."
        ),
    ] = ENGINE_STOP_GRACE_S,
) -> int:
    """Stop the engines a stopped agent left running: SIGTERM to each recorded engine's
    process group (and SIGCONT, so that one stopped by job control acts on it), SIGKILL
    after --grace, and forget their records. No agent may run on
    the state directory meanwhile. Nothing reaches the control plane (no agent is
    connected): it finds the shards gone when the node's agent next says hello. To stop
    engines and have the stops recorded, stop the agent run with --engines-on-exit stop.

    Exit codes: 0 every recorded engine is stopped (or none was recorded), 1 an agent
    holds a state directory or an engine survived SIGKILL, 2 bad usage, or a state
    directory that does not exist or is no agent's (then nothing is stopped).

    ```
    llmgw-agent stop-engines --state-dir /var/lib/llmgw-agent
    llmgw-agent stop-engines --state-dir /tmp/gpu-07 --state-dir /tmp/gpu-08 --grace 0
    ```
    """
    if not grace >= 0:
        return _fail(STOP_ENGINES, f"--grace {grace}: expected 0 or more seconds", EXIT_USAGE)
    try:
        directories = state_dir or [_state_dir_from_env()]
    except ConfigError as exc:
        return _fail(STOP_ENGINES, str(exc), EXIT_USAGE)
    for directory in directories:
        refusal = _not_a_state_dir(directory, named_by_flag=bool(state_dir))
        if refusal is not None:
            return _fail(STOP_ENGINES, refusal, EXIT_USAGE)
    code = EXIT_OK
    for directory in directories:
        try:
            lock = _lock_state_dir(directory)
        except (StateDirBusy, OSError) as exc:
            code = _fail(STOP_ENGINES, f"{exc}; stop that agent first", EXIT_FAILED)
            continue
        with lock:
            stops = stop_recorded_engines(directory, grace)
        if not stops:
            print(f"{directory}: no engines recorded")
        for stop in stops:
            record = stop.record
            shard = f"{record.replica_id} shard {record.shard_index} (pid {record.pid})"
            if stop.outcome == "survived":
                code = _fail(STOP_ENGINES, f"{directory}: {shard} survived SIGKILL", EXIT_FAILED)
            else:
                print(f"{directory}: {shard} {stop.outcome}")
    return code


async def run_agent(config: AgentConfig) -> int:
    """Run until a signal (0) or a fatal connection failure (1). Engines are left running."""
    try:
        ssl_context = client_ssl_context(config.ca, config.cert, config.key)
    except CertificateNotYetValid as exc:
        # Not bad configuration: a machine that booted before its clock was set, or a
        # certificate issued by a clock a little ahead, is fixed by time alone, and a
        # supervisor must try again (exit 2 tells it not to).
        return _fail(PROGRAM, str(exc), EXIT_FAILED)
    except TlsConfigurationError as exc:
        return _fail(PROGRAM, str(exc), EXIT_USAGE)
    try:
        lock = _lock_state_dir(config.state_dir)
    except StateDirBusy as exc:
        return _fail(PROGRAM, str(exc), EXIT_FAILED)
    except OSError as exc:
        return _fail(PROGRAM, _unusable_state_dir(config.state_dir, exc), EXIT_FAILED)
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
            return _fail(PROGRAM, str(exc), EXIT_USAGE)
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
                return _fail(PROGRAM, str(error), EXIT_FAILED)
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


def _lock_state_dir(state_dir: Path) -> TextIO:
    """Hold ``<state_dir>/agent.lock`` until the returned file is closed: two agents on one
    state directory would both re-attach, watch and report the same engines."""
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = open_regular_to_append(state_dir / LOCK_FILE)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise StateDirBusy(
            f"another llmgw-agent (pid {holder}) is using the state directory {state_dir}"
        ) from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def _unusable_state_dir(state_dir: Path, error: OSError) -> str:
    """Why the agent cannot keep its state in ``state_dir``, and where that is set."""
    where = f" ({error.filename})" if error.filename and Path(error.filename) != state_dir else ""
    remedy = "free space on it, or give another" if error.errno == errno.ENOSPC else "give one"
    # mkdir says only "File exists" of a file, a FIFO or a dangling link where the directory
    # was to be: say which.
    problem = (
        (not_a_directory(state_dir) if error.errno == errno.EEXIST else None)
        or error.strerror
        or str(error)
    )
    return (
        f"the state directory {state_dir} cannot be used{where}: {problem}; "
        f"{remedy} this agent's user can write (--state-dir, {STATE_DIR_ENV} or state_dir in "
        "the config file)"
    )


def _mark(command: str, state_dir: Path | None, gpu: int, reason: str | None) -> int:
    if gpu < 0:
        return _fail(command, f"--gpu {gpu}: a GPU index is 0 or more", EXIT_USAGE)
    if reason is not None and not reason.strip():
        return _fail(command, "--reason: say why the GPU is unhealthy", EXIT_USAGE)
    directory = _fake_gpu_state_dir(command, state_dir)
    if isinstance(directory, int):
        return directory
    health_file = fake_gpu_health_file(directory)
    return _rewrite_fake_gpu_file(
        command, health_file, lambda: mark_fake_gpu(health_file, gpu, reason)
    )


def _rewrite_fake_gpu_file(command: str, path: Path, rewrite: Callable[[], tuple[str, ...]]) -> int:
    """Run ``rewrite`` of the fake GPUs' file ``path``; say what it dropped from the file."""
    try:
        dropped = rewrite()
    except ValueError as exc:
        return _fail(command, str(exc), EXIT_USAGE)
    except OSError as exc:
        return _fail(command, f"cannot write {path}: {exc}", EXIT_FAILED)
    for problem in dropped:
        print_command_error(command, f"dropped from the file: {problem}")
    return EXIT_OK


def _fake_gpu_state_dir(command: str, state_dir: Path | None) -> Path | int:
    """The state directory a ``fake-gpu`` command writes into, or its exit code."""
    try:
        directory = state_dir or _state_dir_from_env()
    except ConfigError as exc:
        return _fail(command, str(exc), EXIT_USAGE)
    missing = _not_a_directory(directory)
    if missing is not None:
        # The running agent made its state directory; one that is not there is mistyped,
        # and a file written into it (creating it) would reach no agent.
        return _fail(
            command,
            f"{_named_state_dir(directory, named_by_flag=bool(state_dir))}: {missing}; give "
            "the state directory of the agent that runs the fake GPUs",
            EXIT_USAGE,
        )
    return directory


def _not_a_state_dir(directory: Path, *, named_by_flag: bool) -> str | None:
    """Why ``directory`` is no agent's state directory (a typo, most likely), or None. One
    an agent ran on holds its ``agent.lock``, and its shard records once it started an
    engine; stopping nothing there would hide the typo, and locking it would write a file
    into a directory that is not the agent's."""
    what = _not_a_directory(directory)
    ran_there = (directory / LOCK_FILE).exists() or RecordStore(directory).directory.is_dir()
    if what is None and not ran_there:
        what = f"not an agent's state directory (no {LOCK_FILE}, no shard records)"
    if what is None:
        return None
    named = _named_state_dir(directory, named_by_flag=named_by_flag)
    return f"{named}: {what}; give the state directory of the agent whose engines to stop"


def _not_a_directory(path: Path) -> str | None:
    """``no such directory`` or ``not a directory``; None for a directory."""
    if path.is_dir():
        return None
    return "not a directory" if path.exists() else "no such directory"


def _named_state_dir(directory: Path, *, named_by_flag: bool) -> str:
    """How an error names the state directory: by its flag when it was given one."""
    return f"--state-dir {directory}" if named_by_flag else f"the state directory {directory}"


def _state_dir_from_env() -> Path:
    """``$LLMGW_AGENT_STATE_DIR``, else the default; ``ConfigError`` if it is set empty."""
    configured = filled_variable(os.environ, STATE_DIR_ENV)
    return Path(configured).expanduser() if configured else default_state_dir(os.environ)


def _fail(command: str, message: str, code: int) -> int:
    print_command_error(command, message)
    return code


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
