"""`llmgw-cli replicas` reads the replicas page after page, as many as there are, and
prints them as one list, without the ended ones unless asked, saying so only when ended ones
were left out (or the server does not say); a page that repeats a replica fails the
command, and a server older than paging is asked once, for every replica. The replicas the
dev cluster asks for (``cli.operator.get_replicas``) are read page after page too."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from urllib.parse import parse_qs, urlsplit

import msgspec
import pytest

import cli.replica_pages
from cli.client import AdminClient
from cli.config import ConnectionFlags, ConnectionSettings
from cli.operator import get_replicas
from cli.replicas import ENDED_NOT_SHOWN, list_replicas
from devcluster.admin import serving
from tests.support.stub_admin import StubHandler, stub_admin_api

REPLICA_COUNT = 1_203
"""More than two pages of 500."""
ENDED = ("stopped", "failed", "timed_out", "lost")
ENDED_LEFT_OUT = "X-Ended-Replicas-Left-Out"


def listed_replica(n: int) -> dict[str, object]:
    """Replica ``n`` as the admin API lists it: three of every four have ended."""
    phase = "serving" if n % 4 == 0 else ENDED[(n // 4) % len(ENDED)]
    return {"id": f"llama-{n}", "model": "llama", "number": n, "phase": phase, "nodes": ["gpu-1"]}


REPLICAS = [listed_replica(n) for n in range(1, REPLICA_COUNT + 1)]


def matching(query: dict[str, list[str]]) -> list[dict[str, object]]:
    """The replicas the filters of ``query`` match, as the admin API answers them."""
    found = REPLICAS
    if "phase" in query:
        found = [r for r in found if r["phase"] == query["phase"][0]]
    if query.get("ended") == ["false"]:
        found = [r for r in found if r["phase"] not in ENDED]
    return found


class Paging(StubHandler):
    """As the admin API: the replicas matching, with ``limit`` at most that many after the
    replica ``after``."""

    asked: list[dict[str, list[str]]] = []

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        type(self).asked.append(query)
        found = matching(query)
        ids = [r["id"] for r in found]
        start = ids.index(query["after"][0]) + 1 if "after" in query else 0
        limit = int(query["limit"][0]) if "limit" in query else len(found)
        self.answer(200, "application/json", msgspec.json.encode(found[start : start + limit]))


class SayingWhatWasLeftOut(Paging):
    """As ``Paging``, with ``X-Ended-Replicas-Left-Out`` on each list without the ended
    replicas: whether an ended one matched the filters."""

    def answer(
        self,
        status: int,
        content_type: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        query = parse_qs(urlsplit(self.path).query)
        if query.get("ended") == ["false"]:
            anyhow = {name: values for name, values in query.items() if name != "ended"}
            left_out = any(r["phase"] in ENDED for r in matching(anyhow))
            headers = {**(headers or {}), ENDED_LEFT_OUT: str(left_out).lower()}
        super().answer(status, content_type, body, headers)


class OlderThanPaging(StubHandler):
    """As the admin API before paging: ``ended``, ``after`` and ``limit`` refused (400
    naming them), every replica matching in one answer otherwise."""

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        refused = sorted(set(query) & {"ended", "after", "limit"})
        if refused:
            detail = (
                f"{', '.join(refused)}: not a query parameter of /admin/v1/replicas (it takes "
                "model, node, phase)"
            )
            body = {"title": "validation", "status": 400, "detail": detail}
            self.answer(400, "application/problem+json", msgspec.json.encode(body))
            return
        self.answer(200, "application/json", msgspec.json.encode(matching(query)))


class RepeatingThePageStart(StubHandler):
    """Pages of ``limit`` replicas, each starting with the replica ``after`` instead of
    after it."""

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        ids = [r["id"] for r in REPLICAS]
        start = ids.index(query["after"][0]) if "after" in query else 0
        page = REPLICAS[start : start + int(query["limit"][0])]
        self.answer(200, "application/json", msgspec.json.encode(page))


@pytest.fixture
def paging(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    Paging.asked = []
    with stub_admin_api(Paging, monkeypatch) as url:
        yield url


def listed_ids(capsys: pytest.CaptureFixture[str], url: str, **flags: object) -> list[str]:
    code = list_replicas(output="json", connection=ConnectionFlags(admin_url=url), **flags)  # type: ignore[arg-type]
    assert code == 0
    return [r["id"] for r in json.loads(capsys.readouterr().out)]


def test_the_replicas_not_ended_are_listed_by_default_read_page_after_page(
    paging: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = listed_ids(capsys, paging)

    assert ids == [r["id"] for r in REPLICAS if r["phase"] == "serving"]
    assert all(query["ended"] == ["false"] for query in Paging.asked)


def test_every_replica_is_listed_once_in_order_with_all(
    paging: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = listed_ids(capsys, paging, all_replicas=True)

    assert ids == [r["id"] for r in REPLICAS]
    assert len(Paging.asked) == 3
    assert all(query["limit"] == ["500"] and "ended" not in query for query in Paging.asked)
    afters = [query.get("after") for query in Paging.asked]
    assert afters == [None, [ids[499]], [ids[999]]]


def test_an_ended_phase_lists_those_ended_replicas(
    paging: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = listed_ids(capsys, paging, phase="stopped")

    assert ids == [r["id"] for r in REPLICAS if r["phase"] == "stopped"]
    assert ids


def test_a_table_says_on_stderr_that_ended_replicas_are_not_shown(
    paging: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ConnectionFlags(admin_url=paging)

    assert list_replicas(connection=flags) == 0
    assert capsys.readouterr().err == ENDED_NOT_SHOWN + "\n"
    assert list_replicas(connection=flags, all_replicas=True) == 0
    assert capsys.readouterr().err == ""
    assert list_replicas(connection=flags, output="json") == 0
    assert capsys.readouterr().err == ""


def test_a_table_says_ended_replicas_are_not_shown_only_when_the_server_left_some_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli.replica_pages, "REPLICAS_PAGE_SIZE", 100)
    Paging.asked = []
    with stub_admin_api(SayingWhatWasLeftOut, monkeypatch) as url:
        flags = ConnectionFlags(admin_url=url)

        # No serving replica has ended, and no other was asked for.
        assert list_replicas(connection=flags, phase="serving") == 0
        assert capsys.readouterr().err == ""
        assert list_replicas(connection=flags) == 0
        assert capsys.readouterr().err == ENDED_NOT_SHOWN + "\n"

    assert len(Paging.asked) == 8, "300 serving replicas: 3 full pages and an empty one, twice"
    assert all(query["ended"] == ["false"] for query in Paging.asked)


def test_a_server_older_than_paging_tells_by_its_answer_whether_ended_ones_were_left_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with stub_admin_api(OlderThanPaging, monkeypatch) as url:
        flags = ConnectionFlags(admin_url=url)

        assert list_replicas(connection=flags, phase="serving") == 0
        assert capsys.readouterr().err == ""
        assert list_replicas(connection=flags) == 0
        assert capsys.readouterr().err == ENDED_NOT_SHOWN + "\n"


def test_a_server_older_than_paging_is_asked_once_and_the_ended_left_out_here(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with stub_admin_api(OlderThanPaging, monkeypatch) as url:
        every = listed_ids(capsys, url, all_replicas=True)
        existing = listed_ids(capsys, url)

    assert every == [r["id"] for r in REPLICAS]
    assert existing == [r["id"] for r in REPLICAS if r["phase"] == "serving"]


def test_a_page_repeating_a_replica_listed_already_fails_the_listing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli.replica_pages, "REPLICAS_PAGE_SIZE", 2)
    with stub_admin_api(RepeatingThePageStart, monkeypatch) as url:
        code = list_replicas(all_replicas=True, connection=ConnectionFlags(admin_url=url))

    assert code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"llmgw-cli replicas: the admin API at {url} sent a replica list page that repeats "
        "replica llama-2, listed already: the listing cannot be trusted to be whole; it is "
        "not the llmgw admin API, or it is broken\n"
    )


def test_the_replicas_a_script_asks_for_are_read_page_after_page(
    paging: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every serving replica in one answer is more than this client reads: a page is not.
    monkeypatch.setattr(cli.replica_pages, "REPLICAS_PAGE_SIZE", 7)
    serving_ids = [str(r["id"]) for r in REPLICAS if r["phase"] == "serving"]
    settings = ConnectionSettings(admin_url=paging)
    with AdminClient(settings, max_answer_bytes=4096) as client:
        reply = get_replicas(client, phase="serving")
        served = serving(client, "llama")

    assert [r.id for r in reply.value] == serving_ids
    assert [r["id"] for r in json.loads(reply.raw)] == serving_ids
    assert served == sorted(serving_ids)
    pages = len(serving_ids) // 7 + 1
    assert len(Paging.asked) == 2 * pages
    assert all(
        (query["phase"], query["limit"]) == (["serving"], ["7"]) and "ended" not in query
        for query in Paging.asked
    )
