"""`llmgw-cli rollout status --wait` on a paused rollout: a paused rollout goes nowhere until
an operator resumes or undoes it, so the wait ends at once (with or without --timeout) with
exit 3, saying why it is paused and which commands move it on; a CI pipeline running it is
told, not left hanging."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from cli.config import ConnectionFlags
from cli.rollout import rollout_status
from tests.support.stub_admin import StubHandler, stub_admin_api

PAUSED = {
    "model": "llama",
    "rollout_id": "rollout-llama-r2",
    "state": "paused",
    "revision": 2,
    "from_revision": 1,
    "model_revision": 2,
    "steps": [{"replicas": 1, "target": 1, "hold_s": 600.0}, {"replicas": "all", "target": 2}],
    "desired": 2,
    "pause_reason": "looking at TTFT",
}
SUCCEEDED = {**PAUSED, "state": "succeeded", "finished": True, "pause_reason": None}


class PausedThenSucceeded(StubHandler):
    """Paused for the first few looks, then succeeded: a wait that followed it through the
    pause would end with exit 0, as if nobody needed to act."""

    looks = 0

    def do_GET(self) -> None:
        PausedThenSucceeded.looks += 1
        view = PAUSED if PausedThenSucceeded.looks <= 3 else SUCCEEDED
        self.answer(200, "application/json", json.dumps(view).encode())


@pytest.fixture
def connection(monkeypatch: pytest.MonkeyPatch) -> Iterator[ConnectionFlags]:
    PausedThenSucceeded.looks = 0
    with stub_admin_api(PausedThenSucceeded, monkeypatch) as url:
        yield ConnectionFlags(admin_url=url)


@pytest.mark.parametrize("timeout", [None, 3600.0])
def test_wait_on_a_paused_rollout_ends_with_exit_3_naming_why_and_what_moves_it_on(
    connection: ConnectionFlags, capsys: pytest.CaptureFixture[str], timeout: float | None
) -> None:
    code = rollout_status("llama", wait=True, timeout=timeout, connection=connection)

    captured = capsys.readouterr()
    assert code == 3
    assert PausedThenSucceeded.looks == 1
    assert captured.err == (
        "llmgw-cli rollout status: rollout-llama-r2 is paused (looking at TTFT) and waits for "
        "an operator: llmgw-cli rollout resume llama goes on, llmgw-cli rollout undo llama "
        "rolls it back\n"
    )


def test_with_output_json_the_paused_status_is_printed_whole(
    connection: ConnectionFlags, capsys: pytest.CaptureFixture[str]
) -> None:
    code = rollout_status("llama", wait=True, output="json", connection=connection)

    captured = capsys.readouterr()
    assert code == 3
    assert json.loads(captured.out)["state"] == "paused"
    assert "waits for an operator" in captured.err
