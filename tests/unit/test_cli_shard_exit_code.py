"""`llmgw-cli replica ID` gives a failed shard's exit code once. The agent's error already
says how an engine ended (`engine exited with code 1: ...`, `engine was killed by SIGKILL`),
and the table used to add `(exit code 1)` after it; an error that does not say how the
engine ended keeps the code after it."""

from __future__ import annotations

import msgspec
import pytest

from cli.replicas import print_replica
from cli.views import ReplicaView

NOT_FOUND = (
    "engine exited with code 1: model file not found (E gguf_init_from_file: failed to "
    "open GGUF file '/models/missing.gguf' (No such file or directory))"
)


def failed_with(error: str, exit_code: int) -> ReplicaView:
    shard = {
        "index": 0,
        "node_id": "gpu-09",
        "gpus": [0],
        "port": 27201,
        "phase": "failed",
        "error": error,
        "exit_code": exit_code,
    }
    answer = {"id": "gemma-1", "model": "gemma", "phase": "failed", "shards": [shard]}
    return msgspec.convert(answer, ReplicaView)


def shown(replica: ReplicaView, capsys: pytest.CaptureFixture[str]) -> str:
    print_replica(replica, wide=True)
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [(NOT_FOUND, 1), ("engine exited with code 3", 3), ("engine was killed by SIGKILL", -9)],
)
def test_an_error_that_says_how_the_engine_ended_is_not_followed_by_its_code_again(
    error: str, exit_code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    out = shown(failed_with(error, exit_code), capsys)

    assert error in out
    assert "(exit code" not in out


def test_an_error_that_does_not_say_how_the_engine_ended_is_followed_by_its_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = shown(failed_with("not ready within the startup timeout", 3), capsys)

    assert "not ready within the startup timeout (exit code 3)" in out
