"""The admin API's replicas as ``llmgw-cli replicas`` lists them: page after page, never
trusting a listing that repeats itself, and in one answer from a server older than paging.

A fleet that scales to zero and back and rolls out revisions ends thousands of replicas a
day, and the log keeps every one: the list is read 500 at a time so that no answer is the
whole history, and without the ended ones unless asked.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import msgspec

from cli.client import AdminClient, ApiProblem, decode
from cli.operator import ADMIN
from cli.paging import Listed, check_no_repeats, check_page_count, listed_items
from cli.views import ReplicaSummary

REPLICAS_PAGE_SIZE = 500
ENDED_PHASES = frozenset({"stopped", "failed", "timed_out", "lost"})
"""The phases of a replica that has ended, as the admin API names them."""
PAGING_PARAMETERS = frozenset({"ended", "after", "limit"})
"""The query parameters of the replica list that a server older than paging refuses."""
NOT_A_QUERY_PARAMETER = ": not a query parameter of "
"""How the admin API refuses a query parameter its route does not take (400)."""

ListedReplica = Listed[ReplicaSummary]

_replica_decoder = msgspec.json.Decoder(ReplicaSummary)
_raw_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])


def list_replicas(
    client: AdminClient, filters: Mapping[str, str], *, ended: bool
) -> list[ListedReplica]:
    """The replicas ``filters`` (``model``, ``node``, ``phase``) match, by model and
    number, ended ones too when ``ended``, each with its JSON as the API sent it."""
    asked = dict(filters) if ended else {**filters, "ended": "false"}
    try:
        return _every_page(client, asked)
    except ApiProblem as problem:
        if not older_than_paging(problem):
            raise
    # Its one answer holds every replica the filters match: the ended ones are left out here.
    replicas = _page(client, filters)
    return [r for r in replicas if ended or r.view.phase not in ENDED_PHASES]


def older_than_paging(problem: ApiProblem) -> bool:
    """Whether ``problem`` is a server older than paging refusing the paging parameters (a
    400 naming only them: ``after, limit: not a query parameter of /admin/v1/replicas``)."""
    named, refused, _ = str(problem).partition(NOT_A_QUERY_PARAMETER)
    if problem.status != 400 or not refused:
        return False
    return {name.strip() for name in named.split(",")} <= PAGING_PARAMETERS


def _every_page(client: AdminClient, filters: Mapping[str, str]) -> list[ListedReplica]:
    replicas: list[ListedReplica] = []
    seen: set[str] = set()
    params: dict[str, str | int] = {**filters, "limit": REPLICAS_PAGE_SIZE}
    for pages in itertools.count(1):
        check_page_count(client, pages, "replica list", REPLICAS_PAGE_SIZE, "replicas")
        page = _page(client, params)
        check_no_repeats(client, page, seen, "replica list", "replica")
        replicas += page
        if len(page) != REPLICAS_PAGE_SIZE:
            break
        params = {**filters, "limit": REPLICAS_PAGE_SIZE, "after": page[-1].view.id}
    return replicas


def _page(client: AdminClient, params: Mapping[str, str | int]) -> list[ListedReplica]:
    """One page of the replica list: its array is split into replicas as sent, and each
    decoded once."""
    raw = client.request("GET", f"{ADMIN}/replicas", params=params)
    replicas: list[msgspec.Raw] = decode(_raw_list_decoder, raw, "replica list")
    return listed_items(_replica_decoder, replicas, "replica list")
