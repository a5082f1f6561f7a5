"""The bound on how far one listing of the admin API (``keys list``, ``history``) reads:
past it, or on a cursor that stays put, the listing stops with an ``EndlessListing``."""

from __future__ import annotations

from cli.client import AdminClient, EndlessListing
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
