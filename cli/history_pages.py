"""One replica's, node's, model's, key's or certificate's history as llmgw-cli reads it from
``/admin/v1/history``: page after page from a position on, or the newest events read back
from the end, never following a cursor that stays put."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Mapping

import msgspec

from cli.arguments import segment
from cli.client import AdminClient, EndlessListing, EventView, decode
from cli.paging import Listed, check_page_count, listed_items

HISTORY_PAGE_SIZE = 500
NEWEST = 2**63 - 1
"""The largest log position: history read back ``before`` it starts at the newest event."""
HISTORY_SUBJECTS = ("replica", "node", "model", "key", "certificate")
_HISTORY_KEYS = {
    "replica": "the replica id",
    "node": "the node id",
    "model": "the model name",
    "key": "the key prefix or name",
    "certificate": "the certificate serial",
}


class HistoryPage(msgspec.Struct, frozen=True, kw_only=True):
    events: list[msgspec.Raw]
    next_after: int | None = None
    next_before: int | msgspec.UnsetType | None = msgspec.UNSET
    """Unset in the answer of a server older than reading back with ``before``."""


HistoryEvent = Listed[EventView]


_event_decoder = msgspec.json.Decoder(EventView)
_page_decoder = msgspec.json.Decoder(HistoryPage)


def history(
    client: AdminClient, subject: str, key: str, *, after: int = 0, limit: int | None = None
) -> list[HistoryEvent]:
    """Every event about one replica, node, model or key after position ``after``,
    oldest first, reading page after page; with ``limit``, only the newest ``limit`` of
    them (read back from the newest, still returned oldest first)."""
    if subject not in HISTORY_SUBJECTS:
        raise ValueError(f"subject must be one of {', '.join(HISTORY_SUBJECTS)}")
    if limit is None:
        return list(_iter_history(client, subject, key, after))
    pages: list[list[HistoryEvent]] = []
    remaining, before = limit, NEWEST
    # After the largest position no event can be: the API refuses after >= before as a
    # request that cannot be meant, which this one, from the flags alone, is not.
    while remaining > 0 and after < before:
        check_page_count(client, len(pages) + 1, "history", HISTORY_PAGE_SIZE, "events")
        size = min(remaining, HISTORY_PAGE_SIZE)
        page = _history_page(
            client, subject, key, {"after": after, "before": before, "limit": size}
        )
        if page.next_before is msgspec.UNSET:
            # A server older than `before` read on from `after`: read it all, keep the end.
            return list(deque(_iter_history(client, subject, key, after), maxlen=limit))
        pages.append(_events_of(page))
        remaining -= len(page.events)
        if page.next_before is None:
            break
        if page.next_before >= before:
            raise _stuck_cursor(client, "next_before", page.next_before, "before", before)
        before = page.next_before
    return [event for page in reversed(pages) for event in page][-limit:]


def _iter_history(
    client: AdminClient, subject: str, key: str, after: int
) -> Iterator[HistoryEvent]:
    for pages in itertools.count(1):
        check_page_count(client, pages, "history", HISTORY_PAGE_SIZE, "events")
        page = _history_page(client, subject, key, {"after": after, "limit": HISTORY_PAGE_SIZE})
        yield from _events_of(page)
        if page.next_after is None:
            return
        if page.next_after <= after:
            raise _stuck_cursor(client, "next_after", page.next_after, "after", after)
        after = page.next_after


def _stuck_cursor(
    client: AdminClient, given: str, value: int, asked: str, was: int
) -> EndlessListing:
    """A history page's cursor that does not move on from the position asked for: the
    next page asked for would be this one again."""
    return EndlessListing(
        f"the admin API at {client.settings.admin_url} sent a history page whose {given} "
        f"({value}) does not move on from the {asked} asked for ({was}): stopped reading, "
        f"as it would send pages for ever; it is not the llmgw admin API, or it is broken"
    )


def _history_page(
    client: AdminClient, subject: str, key: str, params: Mapping[str, int]
) -> HistoryPage:
    body = _get(
        client, f"/admin/v1/history/{subject}/{segment(key, _HISTORY_KEYS[subject])}", params
    )
    return decode(_page_decoder, body, "history page")


def _get(client: AdminClient, path: str, params: Mapping[str, int | str]) -> bytes:
    return client.request("GET", path, params=params)


def _events_of(page: HistoryPage) -> list[HistoryEvent]:
    return listed_items(_event_decoder, page.events, "event")
