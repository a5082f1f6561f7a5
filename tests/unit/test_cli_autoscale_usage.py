"""`llmgw-cli autoscale MODEL` refuses what the admin API would refuse about its figures as
bad usage (exit 2), in one line naming the option (`llmgw-cli autoscale: --capacity must be
from 0.01 to 1, got 2.5`), and sends nothing: a figure outside its bounds, and a --min above
the --max given with it."""

from __future__ import annotations

import pytest

from cli.main import app
from tests.support.stub_admin import RecordingAdmin


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        (["--min", "3", "--max", "2"], "--min must be at most --max, got --min 3 and --max 2"),
        (["--capacity", "2.5"], "--capacity must be from 0.01 to 1, got 2.5"),
        (["--capacity", "0"], "--capacity must be from 0.01 to 1, got 0"),
        (["--target", "0.001"], "--target must be from 0.01 to 100000, got 0.001"),
        (["--max", "0"], "--max must be from 1 to 10000, got 0"),
        (["--min", "-1"], "--min must be from 0 to 10000, got -1"),
        (["--max-step", "0"], "--max-step must be from 1 to 10000, got 0"),
        (["--up-window", "-1"], "--up-window must be from 0 to 86400, got -1"),
        (
            ["--down-window-min-share", "0"],
            "--down-window-min-share must be above 0 and at most 1, got 0",
        ),
        (
            ["--cold-start-timeout", "0"],
            "--cold-start-timeout must be above 0 and at most 3600, got 0",
        ),
    ],
)
def test_a_figure_the_api_refuses_is_one_line_of_bad_usage_and_nothing_is_sent(
    recording_admin: RecordingAdmin,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    refusal: str,
) -> None:
    with pytest.raises(SystemExit) as ended:
        app(["autoscale", "llama", *options, "--admin-url", recording_admin.url])

    assert ended.value.code == 2
    assert capsys.readouterr().err == f"llmgw-cli autoscale: {refusal}\n"
    assert recording_admin.sent == []


@pytest.mark.parametrize(
    "options",
    [
        ["--min", "2", "--max", "2"],
        ["--min", "0", "--max", "1"],
        ["--min", "3"],  # the API judges it against the model's --max
        ["--capacity", "1", "--down-window-min-share", "1", "--cold-start-timeout", "3600"],
    ],
)
def test_figures_within_the_bounds_are_sent(
    recording_admin: RecordingAdmin, options: list[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        app(["autoscale", "llama", *options, "--admin-url", recording_admin.url])

    assert ended.value.code == 1  # the stub refuses it: what matters is that it was asked
    assert recording_admin.sent == ["PATCH /admin/v1/models/llama/autoscale"]
