"""Whether an engine process can be started from a spec's command template and
environment, on every node and with every value its placeholders may take."""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping
from types import MappingProxyType

import msgspec

from app.domain.exec_limits import argv_refusal
from app.domain.spec_error import SpecError, need_into

COMMAND_PLACEHOLDERS = frozenset(
    {"model", "port", "host", "gpus", "gpu_count", "rank", "world_size", "peers", "leader"}
)
MAX_COMMAND_BYTES = 16 * 1024
"""An engine command template: a long one, with an inline chat template, is a few KiB."""
MAX_AGENT_MESSAGE_BYTES = 1024 * 1024
"""The agent channel's frame limit (``wire.messages.MAX_MESSAGE_BYTES``, kept equal
by a test): a shard's ``start_shard`` command must fit in one frame."""
_LONGEST_ADDRESS = "a" * 253
"""A node's address as placeholders render it, at its longest (a full DNS name)."""
_ENVELOPE_BYTES = 512
"""What a start_shard carries besides the spec's values: its type, ids, indexes, names."""
_NO_PROCESS = "no process can be given one"
AGENT_SET_VARIABLES: Mapping[str, str] = MappingProxyType(
    {
        "CUDA_VISIBLE_DEVICES": "set by the agent from the GPUs it assigns",
        "PORT": "set by the agent to the port it assigns",
        "LLMGW_ENGINE_LAUNCH": "set by the agent to find its engine again after a restart",
    }
)
"""The variables the agent sets in every engine's environment over the spec's, and why: a
copy of ``wire.engine_env.AGENT_SET_VARIABLES`` (the domain imports no ``wire``), kept
equal to it by a test."""
MAX_ENV_ERRORS = 10


def command_errors(command: str) -> list[SpecError]:
    """What is wrong with a command template on its own, by the field ``command``."""
    errors: list[SpecError] = []
    need = need_into(errors)

    need(bool(command.strip()), "command", "must not be empty")
    need(
        "\0" not in command,
        "command",
        f"holds a NUL byte (character {command.find(chr(0)) + 1}): {_NO_PROCESS}",
    )
    unknown = _unknown_placeholders(command)
    need(
        not unknown,
        "command",
        f"unknown placeholder(s) {', '.join(sorted(unknown))}; "
        f"known: {', '.join(sorted(COMMAND_PLACEHOLDERS))}",
    )
    command_size = len(command.encode())
    need(
        command_size <= MAX_COMMAND_BYTES,
        "command",
        f"is {command_size} bytes, over the limit of {MAX_COMMAND_BYTES}",
    )
    return errors


def environment_errors(env: dict[str, str]) -> list[SpecError]:
    """What no engine process can be given: a variable's name that is empty or holds '='
    or NUL, a value that holds NUL. Refused here rather than at every start of the
    replica on the agent (a NUL would even be recorded as U+FFFD: jsonb cannot hold one).
    A variable the agent sets itself (``AGENT_SET_VARIABLES``) is refused too: the agent
    would override it without a word.
    The first ``MAX_ENV_ERRORS`` are named, then how many more there are."""
    errors = []
    for name, value in env.items():
        named = f"holds a variable named {name[:64]!r}: a name cannot"
        if not name:
            errors.append(SpecError("env", f"{named} be empty"))
        elif "\0" in name:
            errors.append(SpecError("env", f"{named} hold a NUL byte ({_NO_PROCESS})"))
        elif "=" in name:
            before, _, after = name.partition("=")
            seen = f"{after}={value}"[:64]
            reason = f"{named} hold '=' (the engine would see {before[:64]} set to {seen!r})"
            errors.append(SpecError("env", reason))
        elif name in AGENT_SET_VARIABLES:
            errors.append(
                SpecError(f"env.{name}", f"is {AGENT_SET_VARIABLES[name]}; a spec cannot set it")
            )
        if "\0" in value:
            errors.append(SpecError(f"env.{name[:64]}", f"holds a NUL byte: {_NO_PROCESS}"))
    if len(errors) > MAX_ENV_ERRORS:
        more = len(errors) - MAX_ENV_ERRORS
        errors[MAX_ENV_ERRORS:] = [SpecError("env", f"and {more} more such problem(s)")]
    return errors


def start_command_errors(
    *, model_name: str, command: str, env: dict[str, str], engine: str, gpus: int, shards: int
) -> list[SpecError]:
    """The command line must split into words that the kernel can start (``exec_limits``),
    and the ``start_shard`` command of a shard must fit in one agent frame, even with the
    longest values its placeholders can take: otherwise every start of the replica would
    fail while it holds its GPUs."""
    endpoint = f"{_LONGEST_ADDRESS}:65535"
    values = {
        "model": model_name,
        "port": "65535",
        "host": _LONGEST_ADDRESS,
        "gpus": ",".join(["99"] * gpus),
        "gpu_count": str(gpus),
        "rank": str(shards - 1),
        "world_size": str(shards),
        "peers": ",".join([endpoint] * (shards - 1)),
        "leader": endpoint,
    }
    try:
        # Split before filling in (the values hold no spaces or quotes, so the words are
        # the same): splitting is slow, and a few KiB of {peers} fill in to megabytes.
        words = shlex.split(command)
    except ValueError as exc:
        return [SpecError("command", f"cannot be split into words: {exc}")]
    size = _ENVELOPE_BYTES + sum(
        len(literal) + (len(values[name]) if name else 0)
        for literal, name, _, _ in string.Formatter().parse(command)
    )
    bound = "at least"
    if size <= MAX_AGENT_MESSAGE_BYTES:
        bound = "up to"
        argv = [word.format(**values) for word in words]
        refusal = argv_refusal(argv)
        if refusal is not None:
            return [SpecError("command", refusal)]
        peer = {"shard_index": 63, "address": _LONGEST_ADDRESS, "port": 65535}
        start_shard = {
            "argv": argv,
            "env": env,
            "gpus": [99] * gpus,
            "peers": [peer] * (shards - 1),
            "engine": engine,
        }
        size = _ENVELOPE_BYTES + len(msgspec.json.encode(start_shard))
    if size <= MAX_AGENT_MESSAGE_BYTES:
        return []
    return [
        SpecError(
            "command",
            f"makes a start_shard command of {bound} {size} bytes (placeholders filled in), "
            f"over the agent channel's limit of {MAX_AGENT_MESSAGE_BYTES} bytes",
        )
    ]


def _unknown_placeholders(template: str) -> set[str]:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        return {"<unbalanced braces>"}
    unknown = {name for _, name, _, _ in parsed if name} - COMMAND_PLACEHOLDERS
    for _, name, format_spec, conversion in parsed:
        if name is None:
            continue
        # Only plain {name}: {} has no value, and a format spec such as {port:>999999999}
        # would render a gigabyte of padding.
        if not name or format_spec or conversion:
            shown = name + (f"!{conversion}" if conversion else "")
            unknown.add("{" + shown + (f":{format_spec}" if format_spec else "") + "}")
    return unknown
