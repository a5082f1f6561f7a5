"""`llmgw-cli keys list` reads the keys page after page, as many as there are, and prints
them as one list; from a server older than paging (every key in each answer) it prints
each key once. Any other page that repeats a key fails the command: such a listing cannot
be trusted to be whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

import cli.key_requests
from cli.config import ConnectionFlags
from cli.keys import list_keys
from tests.support.stub_admin import StubHandler, listed_key, stub_admin_api

KEY_COUNT = 5_003
"""More than the largest page the admin API sends (5,000): two pages at the least."""


class Paging(StubHandler):
    """As the admin API: every key, or with ``limit`` at most that many (5,000 at most)
    after the key ``after``."""

    keys = [listed_key(n, revoked=n % 2 == 0) for n in range(KEY_COUNT)]
    ids = [str(k["id"]) for k in keys]
    asked: list[tuple[dict[str, list[str]], list[str]]] = []
    """Each query, and the ids answered."""

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        start = self.ids.index(query["after"][0]) + 1 if "after" in query else 0
        limit = min(int(query["limit"][0]), 5_000) if "limit" in query else KEY_COUNT
        page = self.keys[start : start + limit]
        type(self).asked.append((query, self.ids[start : start + limit]))
        self.answer(200, "application/json", msgspec.json.encode(page))


class OlderThanPaging(StubHandler):
    """Every key in each answer whatever is asked, and it has as many keys as a page."""

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        count = int(query.get("limit", ["7"])[0])
        self.answer(
            200,
            "application/json",
            msgspec.json.encode([listed_key(n, revoked=n % 2 == 0) for n in range(count)]),
        )


@pytest.fixture
def paging(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    Paging.asked = []
    with stub_admin_api(Paging, monkeypatch) as url:
        yield url


def listed_ids(capsys: pytest.CaptureFixture[str], url: str) -> list[str]:
    assert list_keys(output="json", connection=ConnectionFlags(admin_url=url)) == 0
    return [k["id"] for k in json.loads(capsys.readouterr().out)]


def test_every_key_is_listed_once_in_order_read_page_after_page(
    paging: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = listed_ids(capsys, paging)

    assert ids == Paging.ids
    assert len(Paging.asked) >= 2
    assert all("limit" in query for query, _ in Paging.asked)
    afters = [query.get("after") for query, _ in Paging.asked]
    assert afters == [None] + [[answered[-1]] for _, answered in Paging.asked[:-1]]


def test_a_server_older_than_paging_has_each_key_listed_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with stub_admin_api(OlderThanPaging, monkeypatch) as url:
        ids = listed_ids(capsys, url)

    assert ids == [f"k-{n:08x}" for n in range(len(ids))]


KEYS = [listed_key(n) for n in range(6)]


class OlderThanPagingGrowing(StubHandler):
    """Every key in each answer, and a key more in its second answer than in its first (one
    created meanwhile)."""

    answers = 0

    def do_GET(self) -> None:
        type(self).answers += 1
        count = int(parse_qs(urlsplit(self.path).query)["limit"][0]) + self.answers - 1
        self.answer(200, "application/json", msgspec.json.encode(KEYS[:count]))


def test_a_key_created_while_a_server_older_than_paging_answers_is_listed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, the second answer was dropped once it repeated a key: key-2 went unlisted.
    monkeypatch.setattr(cli.key_requests, "KEYS_PAGE_SIZE", 2)
    OlderThanPagingGrowing.answers = 0
    with stub_admin_api(OlderThanPagingGrowing, monkeypatch) as url:
        ids = listed_ids(capsys, url)

    assert ids == ["k-00000000", "k-00000001", "k-00000002"]


class PagingFromTheLastKey(StubHandler):
    """Pages of ``limit`` keys, each starting with the key ``after`` instead of after it."""

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        ids = [key["id"] for key in KEYS]
        start = ids.index(query["after"][0]) if "after" in query else 0
        page = KEYS[start : start + int(query["limit"][0])]
        self.answer(200, "application/json", msgspec.json.encode(page))


class KeyTwiceInAPage(StubHandler):
    """One page holding a key twice."""

    def do_GET(self) -> None:
        self.answer(200, "application/json", msgspec.json.encode([KEYS[0], KEYS[1], KEYS[1]]))


@pytest.mark.parametrize(
    ("handler", "repeated"),
    [(PagingFromTheLastKey, "k-00000001"), (KeyTwiceInAPage, "k-00000001")],
    ids=["page-repeats-the-last", "key-twice-in-a-page"],
)
def test_a_page_repeating_a_key_listed_already_fails_the_listing(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    handler: type[StubHandler],
    repeated: str,
) -> None:
    # Before, a page repeating a key ended the listing as if it were whole (exit 0): from a
    # server that pages from the key asked for, every key after the second went unlisted.
    monkeypatch.setattr(cli.key_requests, "KEYS_PAGE_SIZE", 3 if handler is KeyTwiceInAPage else 2)
    with stub_admin_api(handler, monkeypatch) as url:
        code = list_keys(output="json", connection=ConnectionFlags(admin_url=url))

    assert code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"llmgw-cli keys list: the admin API at {url} sent a key list page that repeats key "
        f"{repeated}, listed already: the listing cannot be trusted to be whole; it is not "
        "the llmgw admin API, or it is broken\n"
    )
