"""`llmgw-cli rollout undo MODEL --rollout ID` refuses an id no rollout can have as bad usage
(exit 2) and sends nothing; one of the right shape is sent, for the API to judge."""

from __future__ import annotations

import pytest

from app.admin.rollout_schemas import ROLLOUT_ID_PATTERN
from cli.main import app
from cli.rollout import ROLLOUT_ID
from tests.support.stub_admin import RecordingAdmin


def test_the_cli_pattern_is_the_apis() -> None:
    assert ROLLOUT_ID.pattern == ROLLOUT_ID_PATTERN


@pytest.mark.parametrize(
    "named", ["bogus", "", "rollout-llama-r0", "rollout-Llama-r2", "rollout-llama-r2\n", "r2"]
)
def test_an_id_no_rollout_can_have_is_bad_usage_and_nothing_is_sent(
    recording_admin: RecordingAdmin, capsys: pytest.CaptureFixture[str], named: str
) -> None:
    with pytest.raises(SystemExit) as ended:
        app(["rollout", "undo", "llama", "--rollout", named, "--admin-url", recording_admin.url])

    assert ended.value.code == 2
    refusal = capsys.readouterr().err
    assert "--rollout must be a rollout's id as `llmgw-cli rollout status` names it" in refusal
    assert f"got {named!r}" in refusal
    assert recording_admin.sent == []


def test_an_id_of_the_right_shape_is_sent(recording_admin: RecordingAdmin) -> None:
    with pytest.raises(SystemExit) as ended:
        app(
            [
                "rollout",
                "undo",
                "llama",
                "--rollout",
                "rollout-llama-r2",
                "--admin-url",
                recording_admin.url,
            ]
        )

    assert ended.value.code == 1  # the stub refuses it: what matters is that it was asked
    assert recording_admin.sent == ["POST /admin/v1/models/llama/rollout/undo"]
