"""`llmgw-cli autoscale` meeting another change of the model recorded at the same instant:
the API answers 409 `conflict` and records nothing, and the CLI sends the change once more
(the API merges it again with the policy the model has then) before it gives up."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from cli.autoscale import autoscale
from cli.config import ConnectionFlags
from tests.support.stub_admin import StubHandler, stub_admin_api

CONFLICT = {"title": "conflict", "status": 409, "detail": "model stream llama changed"}
RECORDED = {
    "changed": True,
    "model": {
        "name": "llama",
        "desired": 2,
        "serving": 2,
        "spec": {"autoscale": {"min_replicas": 2, "max_replicas": 8}},
    },
}


class ConflictingFirst(StubHandler):
    """Answers the first ``refusals`` changes with ``refusal``, then records each one;
    keeps every request as ``METHOD body``."""

    refusal: ClassVar[dict[str, object]] = CONFLICT
    refusals: ClassVar[int] = 1
    received: ClassVar[list[str]] = []

    def do_PATCH(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
        self.received.append(f"{self.command} {body}".strip())
        if len(self.received) <= self.refusals:
            refused = json.dumps(self.refusal).encode()
            self.answer(409, "application/problem+json", refused)
        else:
            self.answer(200, "application/json", json.dumps(RECORDED).encode())

    def do_DELETE(self) -> None:
        self.do_PATCH()


def changed(
    handler: type[ConflictingFirst], monkeypatch: pytest.MonkeyPatch, *, off: bool = False
) -> int:
    """``autoscale llama --min 2``, or ``--off``, against ``handler``; its exit code."""
    handler.received = []
    with stub_admin_api(handler, monkeypatch) as url:
        flags = ConnectionFlags(admin_url=url)
        if off:
            return autoscale("llama", off=True, connection=flags)
        return autoscale("llama", min_replicas=2, connection=flags)


@pytest.mark.parametrize(
    ("off", "sent"), [(False, 'PATCH {"min":2}'), (True, "DELETE")], ids=["patch", "off"]
)
def test_a_change_meeting_a_conflict_is_sent_once_more_and_recorded(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    off: bool,
    sent: str,
) -> None:
    code = changed(ConflictingFirst, monkeypatch, off=off)

    assert code == 0, capsys.readouterr().err
    assert ConflictingFirst.received == [sent, sent]
    assert capsys.readouterr().out.startswith("model llama: ")


class ConflictingTwice(ConflictingFirst):
    refusals = 2


class Refusing(ConflictingFirst):
    refusal: ClassVar[dict[str, object]] = {
        "title": "invalid-operation",
        "status": 409,
        "detail": "model llama is being removed",
    }


@pytest.mark.parametrize(
    ("handler", "sends", "said"),
    [
        (ConflictingTwice, 2, "model stream llama changed"),
        (Refusing, 1, "model llama is being removed"),
    ],
    ids=["second-conflict", "other-refusal"],
)
def test_a_second_conflict_or_another_refusal_is_reported_and_not_sent_again(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    handler: type[ConflictingFirst],
    sends: int,
    said: str,
) -> None:
    code = changed(handler, monkeypatch)

    assert code == 1
    assert handler.received == ['PATCH {"min":2}'] * sends
    assert said in capsys.readouterr().err
