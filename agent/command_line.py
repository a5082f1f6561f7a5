"""What every ``llmgw-agent`` command shares: its exit codes, the one line on stderr it ends
with when it fails, and the ``--state-dir`` flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from agent.flag_converters import filled_path
from app.usage_errors import print_command_error

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
ENGINE_STOP_GRACE_S = 10.0
"""What an engine gets between SIGTERM and SIGKILL when the agent stops it on exit."""

StateDir = Annotated[
    Path | None,
    Parameter(
        converter=filled_path,
        help="Shard records, engine logs, the fake GPU health file. [default: "
        "$LLMGW_AGENT_STATE_DIR, else /var/lib/llmgw-agent for root, else "
        "$XDG_STATE_HOME/llmgw-agent]",
    ),
]


def fail(command: str, message: str, code: int) -> int:
    """Say ``message`` in one line naming ``command``; ``code`` is the exit code to end with."""
    print_command_error(command, message)
    return code
