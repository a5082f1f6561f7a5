"""A command the kernel would refuse to start is refused when the model is declared, not at
every start of its replicas on the agent."""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest
from msgspec.structs import replace

from app.domain.exec_limits import MAX_ARGUMENT_BYTES
from app.domain.model_spec import ModelSpec, validate_spec

SPEC = ModelSpec(name="m", command="engine --port {port}", shards_per_replica=64)
PEERS_BYTES = 63 * len("a" * 253 + ":65535") + 62
"""``{peers}`` at its longest with 64 shards: 63 full DNS names with their ports."""


def one_word_of(size: int) -> str:
    """A command whose second word is ``size`` bytes with its placeholders at their longest."""
    repeats = size // PEERS_BYTES
    return "engine --peers=" + "x" * (size - repeats * PEERS_BYTES - 8) + "{peers}" * repeats


@pytest.mark.skipif(sys.platform != "linux", reason="the limit is Linux's")
def test_the_limit_is_the_kernels() -> None:
    subprocess.run(["true", "x" * MAX_ARGUMENT_BYTES], check=True)
    with pytest.raises(OSError, match="Argument list too long") as refused:
        subprocess.run(["true", "x" * (MAX_ARGUMENT_BYTES + 1)], check=True)
    assert refused.value.errno == errno.E2BIG


def test_a_word_at_the_limit_is_accepted() -> None:
    assert validate_spec(replace(SPEC, command=one_word_of(MAX_ARGUMENT_BYTES))) == []


def test_a_word_one_byte_over_the_limit_is_refused_naming_it_and_the_limit() -> None:
    [error] = validate_spec(replace(SPEC, command=one_word_of(MAX_ARGUMENT_BYTES + 1)))
    assert error.field == "command"
    assert error.reason == (
        f"makes word 2 up to {MAX_ARGUMENT_BYTES + 1} bytes long (placeholders filled in), "
        f"over the {MAX_ARGUMENT_BYTES} bytes Linux allows one argument: every start would "
        "fail with 'Argument list too long'"
    )


@pytest.mark.parametrize(
    ("command", "shards"),
    [("'' serve --port {port}", 1), ('"" --port {port}', 64), ("{peers} --port {port}", 1)],
    ids=["quoted empty", "double-quoted empty", "no peers to fill in"],
)
def test_an_empty_program_is_refused(command: str, shards: int) -> None:
    spec = replace(SPEC, command=command, shards_per_replica=shards)
    [error] = validate_spec(spec)
    assert (error.field, error.reason) == (
        "command",
        "names an empty program: nothing could be started",
    )
