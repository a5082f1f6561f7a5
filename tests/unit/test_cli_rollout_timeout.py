"""`llmgw-cli rollout status MODEL --timeout S` without --wait is bad usage (exit 2): the
timeout bounds only a wait, and ignored it would let a script believe it set one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.main import app
from tests.support.stub_admin import StubHandler, stub_admin_api

SENT: list[str] = []


class Recording(StubHandler):
    """Notes every request and refuses it, so a test sees whether one was sent."""

    def do_GET(self) -> None:
        SENT.append(f"GET {self.path}")
        self.answer(500, "text/plain", b"")


@pytest.fixture
def admin_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    SENT.clear()
    with stub_admin_api(Recording, monkeypatch) as url:
        yield url


def test_a_timeout_without_wait_is_bad_usage_and_nothing_is_asked(
    admin_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        app(["rollout", "status", "llama", "--timeout", "5", "--admin-url", admin_url])

    assert ended.value.code == 2
    assert "--timeout bounds --wait: give --wait too, or leave --timeout out" in (
        capsys.readouterr().err
    )
    assert SENT == []


def test_a_timeout_with_wait_is_taken(admin_url: str) -> None:
    with pytest.raises(SystemExit) as ended:
        app(["rollout", "status", "llama", "--wait", "--timeout", "5", "--admin-url", admin_url])

    assert ended.value.code == 1  # the stub refuses it: what matters is that it was asked
    assert SENT[0] == "GET /admin/v1/models/llama/rollout"
