"""``llmgw-agent fake-gpu mark|clear|use``: mark a fake GPU unhealthy or healthy again, or
say how much of its memory other processes use, in files of the running agent's state
directory, which it reads within a few seconds (``agent.gpus.fake_health``,
``agent.gpus.fake_memory``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from cyclopts import App, Parameter

from agent.command_line import EXIT_FAILED, EXIT_OK, EXIT_USAGE, StateDir, fail
from agent.config import fake_gpu_health_file
from agent.config_values import ConfigError
from agent.flag_converters import gpu_index, mebibytes
from agent.gpus import mark_fake_gpu
from agent.gpus.fake_memory import memory_file_beside, use_fake_gpu_memory
from agent.state_dir import named_state_dir, no_directory_at, state_dir_from_env
from app.usage_errors import print_command_error

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

FakeGpuIndex = Annotated[
    int,
    Parameter(
        converter=gpu_index,
        help="Index of the fake GPU; one the agent did not declare is refused.",
    ),
]


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
        return fail(command, f"--gpu {gpu}: a GPU index is 0 or more", EXIT_USAGE)
    if mib < 0:
        return fail(command, f"--mib {mib}: MiB used is 0 or more", EXIT_USAGE)
    directory = _fake_gpu_state_dir(command, state_dir)
    if isinstance(directory, int):
        return directory
    memory_file = memory_file_beside(fake_gpu_health_file(directory))
    return _rewrite_fake_gpu_file(
        command, memory_file, lambda: use_fake_gpu_memory(memory_file, gpu, mib)
    )


def _mark(command: str, state_dir: Path | None, gpu: int, reason: str | None) -> int:
    if gpu < 0:
        return fail(command, f"--gpu {gpu}: a GPU index is 0 or more", EXIT_USAGE)
    if reason is not None and not reason.strip():
        return fail(command, "--reason: say why the GPU is unhealthy", EXIT_USAGE)
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
        return fail(command, str(exc), EXIT_USAGE)
    except OSError as exc:
        return fail(command, f"cannot write {path}: {exc}", EXIT_FAILED)
    for problem in dropped:
        print_command_error(command, f"dropped from the file: {problem}")
    return EXIT_OK


def _fake_gpu_state_dir(command: str, state_dir: Path | None) -> Path | int:
    """The state directory a ``fake-gpu`` command writes into, or its exit code."""
    try:
        directory = state_dir or state_dir_from_env()
    except ConfigError as exc:
        return fail(command, str(exc), EXIT_USAGE)
    missing = no_directory_at(directory)
    if missing is not None:
        # The running agent made its state directory; one that is not there is mistyped,
        # and a file written into it (creating it) would reach no agent.
        return fail(
            command,
            f"{named_state_dir(directory, named_by_flag=bool(state_dir))}: {missing}; give "
            "the state directory of the agent that runs the fake GPUs",
            EXIT_USAGE,
        )
    return directory
