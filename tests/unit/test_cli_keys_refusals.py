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
