"""``llmgw-dev``: the whole cluster on this machine, for development and the README's tour.

Exit codes: 0 stopped by Ctrl-C or SIGTERM, 1 could not start or a process exited by
itself (the message says which and where its log is), 2 bad usage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from cyclopts import App, Parameter

from app.commands.path_flag import FilledPath
from app.usage_errors import (
    one_line_usage_errors,
    output_console,
    print_command_error,
    run_program,
    usage_error_console,
    whole_number_flag,
)
from devcluster.demo_model import DEFAULT_STATE_DIRS, DevEngine, engine_unavailable
from devcluster.dev import PROGRAM, DevOptions, run_dev
from devcluster.llamacpp import missing_packages
from devcluster.state_lock import dangling_link_refusal
from wire.version import llmgw_version

EXIT_FAILED = 1
EXIT_USAGE = 2


app = App(
    name=PROGRAM,
    version=llmgw_version,
    help="""A whole llmgw cluster on this machine, until Ctrl-C: PostgreSQL (unless
LLMGW_DATABASE_URL is set), a CA and certificates, the control plane with its gateway on
--client-port, two agents with fake GPUs, a demo model served by the engine simulator (or,
with --engine llamacpp, by llama.cpp's llama-server with a real 270M-parameter model on the
CPU, from the llamacpp extra), and an API key for it. Everything is kept in --state-dir and
reused by the next run; a state directory keeps the engine it was first run with, and
serves one run at a time. Ctrl-C
stops every process it started, engines included (each agent reports its stops first),
and the next run serves the same replicas again.

Exit codes: 0 stopped by Ctrl-C or SIGTERM, 1 could not start or a process exited by
itself (the message names it and its log), 2 bad usage.

```
llmgw-dev
llmgw-dev --engine llamacpp
llmgw-dev --state-dir /tmp/second --admin-port 9081 --agent-port 9443 --client-port 9080
```
""",
    error_formatter=one_line_usage_errors(PROGRAM),
    error_console=usage_error_console(),
    console=output_console(),
)


@app.default
def dev(
    *,
    engine: Annotated[
        DevEngine,
        Parameter(help="What serves the demo model: the engine simulator, or llama.cpp."),
    ] = "simulator",
    state_dir: Annotated[
        Path | None,
        Parameter(
            help="Where everything is kept, and found again by the next run "
            "[default: .llmgw/dev, .llmgw/dev-llamacpp with --engine llamacpp].",
            converter=FilledPath("--state-dir"),
        ),
    ] = None,
    admin_port: Annotated[
        int, Parameter(converter=whole_number_flag, help="The admin API's port on 127.0.0.1.")
    ] = 8081,
    agent_port: Annotated[
        int, Parameter(converter=whole_number_flag, help="The agent hub's port on 127.0.0.1.")
    ] = 8443,
    client_port: Annotated[
        int, Parameter(converter=whole_number_flag, help="The gateway's port on 127.0.0.1.")
    ] = 8080,
    replicas: Annotated[
        int,
        Parameter(
            converter=whole_number_flag,
            help="Replicas of the demo model, the first time it is declared.",
        ),
    ] = 2,
) -> int:
    """Run the cluster until Ctrl-C (see llmgw-dev --help)."""
    if replicas < 0:
        print_command_error(PROGRAM, f"--replicas must not be negative, not {replicas}")
        return EXIT_USAGE
    for name, port in (
        ("--admin-port", admin_port),
        ("--agent-port", agent_port),
        ("--client-port", client_port),
    ):
        if not 1 <= port <= 65535:
            print_command_error(PROGRAM, f"{name} {port}: a port is 1-65535")
            return EXIT_USAGE
    unavailable = engine_unavailable(engine, missing_packages())
    if unavailable is not None:
        print_command_error(PROGRAM, unavailable)
        return EXIT_FAILED
    given = state_dir or DEFAULT_STATE_DIRS[engine]
    dangling = dangling_link_refusal(given)
    if dangling is not None:
        print_command_error(PROGRAM, dangling)
        return EXIT_FAILED
    state = given.resolve()
    options = DevOptions(state, admin_port, agent_port, replicas, client_port, engine)
    return run_dev(options)


def main() -> None:
    run_program(app)
