"""`llmgw-cli scale N` and `autoscale --min/--max/--max-step/--target`, its windows and its cold
start timeout refuse a figure past what the admin API accepts as bad usage (exit 2), and send
nothing; the API keeps its own check."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.domain.autoscale_policy import MAX_AUTOSCALE_WINDOW_S, MAX_COLD_START_S
from app.domain.model_spec import MAX_AUTOSCALE_TARGET, MAX_REPLICAS
from cli.arguments import MAX_REPLICAS as CLI_MAX_REPLICAS
from cli.autoscale import MAX_COLD_START_S as CLI_MAX_COLD_START_S
from cli.autoscale import MAX_WINDOW_S as CLI_MAX_WINDOW_S
from cli.main import app
from tests.support.stub_admin import StubHandler, stub_admin_api

SENT: list[str] = []


class Recording(StubHandler):
    """Notes every request and refuses it, so a test sees whether one was sent."""

    def do_GET(self) -> None:
        SENT.append(f"GET {self.path}")
        self.answer(500, "text/plain", b"")

    def do_POST(self) -> None:
        SENT.append(f"POST {self.path}")
        self.answer(500, "text/plain", b"")

    do_PUT = do_POST


@pytest.fixture
def admin_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    SENT.clear()
    with stub_admin_api(Recording, monkeypatch) as url:
        yield url


def test_the_cli_bound_is_the_domains() -> None:
    assert CLI_MAX_REPLICAS == MAX_REPLICAS
    assert MAX_AUTOSCALE_TARGET == 100_000
    assert (CLI_MAX_WINDOW_S, CLI_MAX_COLD_START_S) == (MAX_AUTOSCALE_WINDOW_S, MAX_COLD_START_S)


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["scale", "llama", "10001"], "REPLICAS must be from 0 to 10000, got 10001"),
        (["autoscale", "llama", "--min", "10001"], "--min must be from 0 to 10000, got 10001"),
        (["autoscale", "llama", "--max", "10001"], "--max must be from 1 to 10000, got 10001"),
        (
            ["autoscale", "llama", "--max-step", "10001"],
            "--max-step must be from 1 to 10000, got 10001",
        ),
        (
            ["autoscale", "llama", "--target", "100001"],
            "--target must be from 0.01 to 100000, got 100001",
        ),
        (
            ["autoscale", "llama", "--up-window", "86401"],
            "--up-window must be from 0 to 86400, got 86401",
        ),
        (
            ["autoscale", "llama", "--down-window", "1e9"],
            "--down-window must be from 0 to 86400, got 1e9",
        ),
        (
            ["autoscale", "llama", "--idle-to-zero", "86401"],
            "--idle-to-zero must be from 0 to 86400, got 86401",
        ),
        (
            ["autoscale", "llama", "--cold-start-timeout", "3601"],
            "--cold-start-timeout must be above 0 and at most 3600, got 3601",
        ),
    ],
)
def test_a_count_past_the_apis_bound_is_bad_usage_and_nothing_is_sent(
    admin_url: str, capsys: pytest.CaptureFixture[str], argv: list[str], refusal: str
) -> None:
    with pytest.raises(SystemExit) as ended:
        app([*argv, "--admin-url", admin_url])

    assert ended.value.code == 2
    assert refusal in capsys.readouterr().err
    assert SENT == []


def test_the_bound_itself_is_sent(admin_url: str) -> None:
    with pytest.raises(SystemExit) as ended:
        app(["scale", "llama", str(MAX_REPLICAS), "--admin-url", admin_url])

    assert ended.value.code == 1  # the stub refuses it: what matters is that it was asked
    assert SENT == ["POST /admin/v1/models/llama/scale"]
