"""llmgw-cli sends every change with an ``Idempotency-Key`` of its own, and a change whose
answer was lost once more with the same key, which the admin API carries out at most once
(tests/integration/test_admin_idempotency.py); a read goes without one."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from cli.client import AdminClient, AnswerLost
from cli.config import ConfigError, ConnectionFlags, ConnectionSettings, resolve_settings
from cli.main import app

SETTINGS = ConnectionSettings(admin_url="http://admin.invalid:8081")
SCALE = "/admin/v1/models/llama/scale"
IDEMPOTENCY_HEADER = "idempotency-key"


def test_a_change_whose_answer_was_lost_is_sent_once_more_with_its_key() -> None:
    sent: list[httpx.Request] = []

    def lost_once(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if len(sent) == 1:
            raise httpx.ReadError("", request=request)
        return httpx.Response(200, json={"changed": True})

    with AdminClient(SETTINGS, transport=httpx.MockTransport(lost_once)) as client:
        answer = client.request("POST", SCALE, body={"replicas": 3})
        client.request("POST", SCALE, body={"replicas": 3})
        client.request("GET", "/admin/v1/models/llama")

    assert answer == b'{"changed":true}'
    keys = [r.headers.get(IDEMPOTENCY_HEADER) for r in sent]
    assert keys[0] is not None
    assert keys[2] is not None
    assert keys[0] == keys[1] != keys[2]
    assert keys[3] is None
    assert sent[0].content == sent[1].content


def test_a_change_whose_answer_was_lost_twice_says_it_was_sent_once_more() -> None:
    sent: list[httpx.Request] = []

    def lost(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        raise httpx.ReadTimeout("", request=request)

    with (
        AdminClient(SETTINGS, timeout_s=2, transport=httpx.MockTransport(lost)) as client,
        pytest.raises(AnswerLost) as raised,
    ):
        client.request("DELETE", "/admin/v1/keys/ci")

    message = str(raised.value)
    assert len(sent) == 2
    assert "DELETE /admin/v1/keys/ci was sent and may have been carried out" in message
    assert "It was sent once more with the same Idempotency-Key and got no answer either" in (
        message
    )


def test_llmgw_cli_help_says_a_lost_change_is_sent_once_more_and_what_a_script_then_sees() -> None:
    shown = io.StringIO()
    app.help_print([], console=Console(file=shown, width=400, force_terminal=False))
    text = " ".join(shown.getvalue().split())

    assert "When its answer is lost" in text, text
    assert "it is sent once more with the same key" in text
    assert "the command exits 1 saying that the change, sent twice with the same key" in text
    assert "(llmgw-cli events --last 20) before running it again" in text


def test_a_given_key_is_the_first_changes_and_numbered_for_the_next_ones() -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"changed": True})

    settings = ConnectionSettings(admin_url=SETTINGS.admin_url, idempotency_key="nightly-7")
    with AdminClient(settings, transport=httpx.MockTransport(answer)) as client:
        client.request("POST", SCALE, body={"replicas": 3})
        client.request("GET", "/admin/v1/models/llama")
        client.request("DELETE", "/admin/v1/keys/ci")

    assert [r.headers.get(IDEMPOTENCY_HEADER) for r in sent] == [
        "nightly-7",
        None,
        "nightly-7.2",
    ]


@pytest.mark.parametrize("key", ["", "a key", "k" * 121, "é"])
def test_a_key_the_admin_api_would_refuse_is_refused_before_anything_is_sent(
    key: str, tmp_path: Path
) -> None:
    flags = ConnectionFlags(admin_url=SETTINGS.admin_url, idempotency_key=key)

    with pytest.raises(ConfigError) as raised:
        resolve_settings(flags, environ={"XDG_CONFIG_HOME": str(tmp_path)})

    assert str(raised.value).startswith("--idempotency-key must be 1 to 120 letters, digits")
