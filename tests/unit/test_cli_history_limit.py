"""`llmgw-cli history ... --limit N` shows the newest N events, oldest first, as `tail -n`
does: read back from the newest with ``before``, or, from a server older than ``before``,
read through and cut to the last N."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

from cli.config import ConnectionFlags
from cli.history import node_history
from cli.main import app
from tests.support.stub_admin import StubHandler, listed_event, stub_admin_api

POSITIONS = list(range(10, 17))


class ForwardOnly(StubHandler):
    """The history endpoint before ``before``: pages on from ``after``, ignoring what it
    does not know, with no ``next_before`` in its answer."""

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        after, limit = int(query["after"][0]), int(query["limit"][0])
        page = [p for p in POSITIONS if p > after][:limit]
        body = {
            "kind": "node",
            "id": "gpu-1",
            "events": [listed_event(p) for p in page],
            "next_after": page[-1] if len(page) == limit else None,
        }
        self.answer(200, "application/json", msgspec.json.encode(body))


@pytest.fixture
def older_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with stub_admin_api(ForwardOnly, monkeypatch) as url:
        yield url


@pytest.mark.parametrize(
    ("limit", "after", "shown"), [(3, 0, [14, 15, 16]), (30, 12, [13, 14, 15, 16])]
)
def test_a_server_older_than_before_still_gives_the_newest_n(
    older_server: str, capsys: pytest.CaptureFixture[str], limit: int, after: int, shown: list[int]
) -> None:
    flags = ConnectionFlags(admin_url=older_server)

    code = node_history("gpu-1", output="json", limit=limit, after=after, connection=flags)

    assert code == 0
    assert [e["position"] for e in json.loads(capsys.readouterr().out)] == shown


@pytest.mark.parametrize(
    ("argv", "flag", "low"),
    [
        (("history", "node", "gpu-1", "--limit"), "--limit", 1),
        (("history", "node", "gpu-1", "--after"), "--after", 0),
        (("events", "--since"), "--since", 0),
        (("events", "--last"), "--last", 0),
    ],
)
def test_a_count_or_position_past_the_last_log_position_is_bad_usage(
    older_server: str,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    flag: str,
    low: int,
) -> None:
    # Before, history --limit 2**63 from a server older than `before` ended in an
    # OverflowError traceback (no deque holds that many), and the others were sent.
    number = str(2**63)

    with pytest.raises(SystemExit) as ended:
        app([*argv, number, "--admin-url", older_server])

    assert ended.value.code == 2
    command = " ".join(word for word in argv[:2] if not word.startswith("-"))
    assert capsys.readouterr().err == (
        f"llmgw-cli {command}: {flag} must be from {low} to {2**63 - 1}, got {number}\n"
    )


class RefusingEmptyRanges(StubHandler):
    """The history endpoint as it refuses ``after`` at or past ``before`` (400), else a
    history with no events."""

    asked: list[dict[str, list[str]]] = []

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        self.asked.append(query)
        after, before = int(query["after"][0]), int(query.get("before", [str(2**63)])[0])
        if after >= before:
            detail = f"after ({after}) must be less than before ({before})"
            problem = {"title": "validation", "status": 400, "detail": detail}
            self.answer(400, "application/problem+json", msgspec.json.encode(problem))
            return
        body = {"kind": "node", "id": "gpu-1", "events": [], "next_before": None}
        self.answer(200, "application/json", msgspec.json.encode(body))


def test_the_newest_events_after_the_last_position_are_none_not_a_refusal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # --after at the largest position with --limit asked the API for the events after it
    # and before it, and printed the API's refusal of flags the operator never gave.
    last = 2**63 - 1
    with stub_admin_api(RefusingEmptyRanges, monkeypatch) as url:
        code = node_history(
            "gpu-1", output="table", limit=3, after=last, connection=ConnectionFlags(admin_url=url)
        )

    assert code == 1
    assert capsys.readouterr().err == (
        f"llmgw-cli history node: no events for node gpu-1 after position {last}\n"
    )
    assert all(int(q["after"][0]) < int(q["before"][0]) for q in RefusingEmptyRanges.asked)
