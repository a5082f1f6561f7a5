"""``llmgw-agent stop-engines``: stop the engines a stopped agent left running, from their
records in its state directory (``agent.engines.recorded_stop``), with no agent connected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from agent.command_line import ENGINE_STOP_GRACE_S, EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail
from agent.config_values import ConfigError
from agent.engines.recorded_stop import stop_recorded_engines
from agent.engines.records import RecordStore
from agent.flag_converters import filled_paths
from agent.state_dir import (
    LOCK_FILE,
    StateDirBusy,
    lock_state_dir,
    named_state_dir,
    no_directory_at,
    state_dir_from_env,
)
from app.usage_errors import finite_number_flag

# The command as typed: the start of every error line it ends with, as of its usage errors.
STOP_ENGINES = "llmgw-agent stop-engines"


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
        return fail(STOP_ENGINES, f"--grace {grace}: expected 0 or more seconds", EXIT_USAGE)
    try:
        directories = state_dir or [state_dir_from_env()]
    except ConfigError as exc:
        return fail(STOP_ENGINES, str(exc), EXIT_USAGE)
    for directory in directories:
        refusal = _not_a_state_dir(directory, named_by_flag=bool(state_dir))
        if refusal is not None:
            return fail(STOP_ENGINES, refusal, EXIT_USAGE)
    code = EXIT_OK
    for directory in directories:
        try:
            lock = lock_state_dir(directory)
        except (StateDirBusy, OSError) as exc:
            code = fail(STOP_ENGINES, f"{exc}; stop that agent first", EXIT_FAILED)
            continue
        with lock:
            stops = stop_recorded_engines(directory, grace)
        if not stops:
            print(f"{directory}: no engines recorded")
        for stop in stops:
            record = stop.record
            shard = f"{record.replica_id} shard {record.shard_index} (pid {record.pid})"
            if stop.outcome == "survived":
                code = fail(STOP_ENGINES, f"{directory}: {shard} survived SIGKILL", EXIT_FAILED)
            else:
                print(f"{directory}: {shard} {stop.outcome}")
    return code


def _not_a_state_dir(directory: Path, *, named_by_flag: bool) -> str | None:
    """Why ``directory`` is no agent's state directory (a typo, most likely), or None. One
    an agent ran on holds its ``agent.lock``, and its shard records once it started an
    engine; stopping nothing there would hide the typo, and locking it would write a file
    into a directory that is not the agent's."""
    what = no_directory_at(directory)
    ran_there = (directory / LOCK_FILE).exists() or RecordStore(directory).directory.is_dir()
    if what is None and not ran_there:
        what = f"not an agent's state directory (no {LOCK_FILE}, no shard records)"
    if what is None:
        return None
    named = named_state_dir(directory, named_by_flag=named_by_flag)
    return f"{named}: {what}; give the state directory of the agent whose engines to stop"
