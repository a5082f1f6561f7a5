"""What one listing of the admin API (``keys list``, ``replicas``, ``history``) reads: its
items, each decoded and kept as sent (``Listed``), and the bounds on what it trusts: past
``MAX_PAGES``, or on a cursor that stays put, the listing stops with an ``EndlessListing``;
on a page that repeats an item it listed already, with a ``RepeatingListing``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import msgspec

from cli.client import AdminClient, EndlessListing, RepeatingListing, decode
from cli.config import SETTING_ENV

MAX_PAGES = 2_000
"""The most pages one listing (``keys list``, ``history``) reads: a million keys or events
at 500 a page, far above any llmgw holds, so that a server that is not the admin API, or a
broken one, that keeps answering full pages of new ones cannot make the CLI read for ever."""


def check_page_count(client: AdminClient, page: int, what: str, size: int, items: str) -> None:
    """An ``EndlessListing`` when ``page`` of a listing would be one past ``MAX_PAGES``."""
    if page > MAX_PAGES:
        raise EndlessListing(
            f"the admin API at {client.settings.admin_url} was still sending {what} "
            f"pages after {MAX_PAGES:,} of them ({MAX_PAGES * size:,} {items}): stopped "
            f"reading; it is not the llmgw admin API, or it is broken; check "
            f"{SETTING_ENV['admin_url']}"
        )


ItemT = TypeVar("ItemT")


@dataclass(frozen=True)
class Listed(Generic[ItemT]):
    """One item of a listing: decoded for the table, and as the API sent it."""

    view: ItemT
    raw: msgspec.Raw
    """The item exactly as the API sent it (``--output json`` prints these)."""


def listed_items(
    decoder: msgspec.json.Decoder[ItemT], items: Iterable[msgspec.Raw], what: str
) -> list[Listed[ItemT]]:
    """Each of ``items`` (a page's array, split as sent) decoded once; an unreadable one is
    ``a {what}`` the client cannot read."""
    return [Listed(decode(decoder, raw, what), raw) for raw in items]


class Identified(Protocol):
    @property
    def id(self) -> str: ...


IdentifiedT = TypeVar("IdentifiedT", bound=Identified)


def check_no_repeats(
    client: AdminClient,
    page: Sequence[Listed[IdentifiedT]],
    seen: set[str],
    what: str,
    item: str,
) -> None:
    """A ``RepeatingListing`` when ``page`` of ``what`` (``key list``) holds an ``item``
    (``key``) that ``seen`` or the page itself holds already: a listing paged by the last
    item's id never sends one twice. ``seen`` takes the page's ids."""
    for listed in page:
        if listed.view.id in seen:
            raise RepeatingListing(
                f"the admin API at {client.settings.admin_url} sent a {what} page that "
                f"repeats {item} {listed.view.id}, listed already: the listing cannot be "
                "trusted to be whole; it is not the llmgw admin API, or it is broken"
            )
        seen.add(listed.view.id)
