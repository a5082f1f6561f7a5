"""A key request the admin API refuses field by field is reported as every other command
reports one: the refusal, then a line for each field and why."""

from __future__ import annotations

import json

import pytest

from cli.config import ConnectionFlags
from cli.keys import create_key
from tests.support.stub_admin import StubHandler, stub_admin_api


class RefusingFields(StubHandler):
    def do_POST(self) -> None:
        body = {
            "title": "validation",
            "status": 422,
            "detail": "the key was not created",
            "errors": [{"field": "models", "reason": "no model 'nope' is known"}],
        }
        self.answer(422, "application/problem+json", json.dumps(body).encode())


def test_a_key_refused_field_by_field_names_each_field(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with stub_admin_api(RefusingFields, monkeypatch) as url:
        code = create_key(name="ci", models="nope", connection=ConnectionFlags(admin_url=url))

    err = capsys.readouterr().err
    assert code == 1
    assert "llmgw-cli keys create: " in err
    assert "  models: no model 'nope' is known" in err


class Recording(StubHandler):
    """Records every request; a key request that reached it would be answered 201."""

    asked: list[str] = []

    def do_POST(self) -> None:
        self.asked.append(self.path)
        self.answer(201, "application/json", b"{}")


def test_a_model_listed_twice_is_bad_usage_said_as_the_api_says_it_and_nothing_is_sent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was sent, and the key recorded with the model once, as if "demo,demo" had been
    # what was meant rather than a slip for another model.
    with stub_admin_api(Recording, monkeypatch) as url:
        code = create_key(
            name="ci", models="demo,qwen, demo", connection=ConnectionFlags(admin_url=url)
        )

    assert code == 2
    assert capsys.readouterr().err == (
        "llmgw-cli keys create: --models: 'demo' is listed twice (1st and 3rd): "
        "list each model once\n"
    )
    assert Recording.asked == []
