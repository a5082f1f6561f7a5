"""`llmgw-cli keys list` reads the keys page after page, as many as there are, and prints
them as one list; from a server older than paging (every key in each answer) it prints
each key once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

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
