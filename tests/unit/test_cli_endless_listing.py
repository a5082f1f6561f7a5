"""`llmgw-cli keys list` and `history` read page after page; a server that keeps answering
pages of new keys or events, or a history page whose cursor does not move on, stops the
command (exit 1) in one line rather than making it read for ever.

Each stub here gives up being endless after ``GIVES_UP_AFTER`` pages (an ordinary last
page), so that a CLI that does not stop reads them all and succeeds instead of hanging."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

import cli.history_pages
import cli.key_requests
import cli.paging
from cli.config import ConnectionFlags
from cli.history import node_history
from cli.history_pages import NEWEST
from cli.keys import list_keys
from tests.support.stub_admin import StubHandler, listed_event, listed_key, stub_admin_api

MAX_PAGES = 3
GIVES_UP_AFTER = 20


@pytest.fixture(autouse=True)
def few_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.paging, "MAX_PAGES", MAX_PAGES)
    monkeypatch.setattr(cli.key_requests, "KEYS_PAGE_SIZE", 2)
    monkeypatch.setattr(cli.history_pages, "HISTORY_PAGE_SIZE", 2)


class Counting(StubHandler):
    asked = 0

    def query(self) -> dict[str, int | str]:
        type(self).asked += 1
        return {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}

    def give_up(self) -> bool:
        return type(self).asked >= GIVES_UP_AFTER

    def json(self, body: object) -> None:
        self.answer(200, "application/json", msgspec.json.encode(body))


class EndlessKeys(Counting):
    """A full page of keys never sent before, whatever is asked."""

    def do_GET(self) -> None:
        limit = int(self.query()["limit"])
        first = self.asked * limit
        self.json([listed_key(n) for n in range(first, first + (0 if self.give_up() else limit))])


class EndlessHistory(Counting):
    """A full page of new events, each with a cursor that moves on."""

    def do_GET(self) -> None:
        query = self.query()
        limit = int(query["limit"])
        if "before" in query:
            before = int(query["before"])
            page = list(range(before - limit, before))
            self.json({"events": [listed_event(p) for p in page], "next_before": page[0]})
            return
        after = int(query["after"])
        page = list(range(after + 1, after + 1 + limit))
        last = self.give_up()
        self.json(
            {"events": [listed_event(p) for p in page], "next_after": None if last else page[-1]}
        )


class StuckHistory(Counting):
    """A full page whose cursor is the one asked for: the same page again and again."""

    def do_GET(self) -> None:
        query = self.query()
        limit = int(query["limit"])
        if "before" in query:
            before = int(query["before"])
            self.json(
                {
                    "events": [] if self.give_up() else [listed_event(before - 1)],
                    "next_before": None if self.give_up() else before,
                }
            )
            return
        after = int(query["after"])
        events = [listed_event(p) for p in range(after + 1, after + 1 + limit)]
        self.json({"events": events, "next_after": None if self.give_up() else after})


def keys_list(url: str) -> int:
    return list_keys(output="json", connection=ConnectionFlags(admin_url=url))


def history(limit: int | None) -> Callable[[str], int]:
    def run(url: str) -> int:
        flags = ConnectionFlags(admin_url=url)
        return node_history("gpu-1", output="json", limit=limit, connection=flags)

    return run


@pytest.mark.parametrize(
    ("handler", "command", "said"),
    [
        (EndlessKeys, keys_list, "was still sending key list pages after 3 of them (6 keys)"),
        (EndlessHistory, history(None), "was still sending history pages after 3 of them"),
        (EndlessHistory, history(100), "was still sending history pages after 3 of them"),
        (StuckHistory, history(None), "whose next_after (0) does not move on from the after "
         "asked for (0)"),
        (StuckHistory, history(100), f"whose next_before ({NEWEST}) does not move "
         f"on from the before asked for ({NEWEST})"),
    ],
    ids=["keys", "history", "history-limit", "history-stuck", "history-limit-stuck"],
)  # fmt: skip
def test_a_listing_that_never_ends_fails_in_one_line_after_few_pages(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    handler: type[Counting],
    command: Callable[[str], int],
    said: str,
) -> None:
    handler.asked = 0
    with stub_admin_api(handler, monkeypatch) as url:
        code = command(url)

    assert code == 1
    err = capsys.readouterr().err
    assert said in err
    assert err.count("\n") == 1
    assert handler.asked <= MAX_PAGES
