"""The admin API's replicas as ``llmgw-cli replicas`` lists them, and the calls scripts share
(``cli.operator.get_replicas``, the dev cluster's serving replicas): page after page, never
trusting a listing that repeats itself, and in one answer from a server older than paging.

A fleet that scales to zero and back and rolls out revisions ends thousands of replicas a
day, and the log keeps every one: the list is read 500 at a time so that no answer is the
whole history, and without the ended ones unless asked. Whether that left any out is what
the first page's ``X-Ended-Replicas-Left-Out`` says, where the server sends it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from cli.client import ADMIN, AdminClient, Answer, ApiProblem, decode
from cli.paging import Listed, check_no_repeats, check_page_count, listed_items
from cli.views import ReplicaSummary

REPLICAS_PAGE_SIZE = 500
ENDED_PHASES = frozenset({"stopped", "failed", "timed_out", "lost"})
"""The phases of a replica that has ended, as the admin API names them."""
PAGING_PARAMETERS = frozenset({"ended", "after", "limit"})
"""The query parameters of the replica list that a server older than paging refuses."""
NOT_A_QUERY_PARAMETER = ": not a query parameter of "
"""How the admin API refuses a query parameter its route does not take (400)."""
ENDED_LEFT_OUT_HEADER = "x-ended-replicas-left-out"
"""Sent with a list without the ended replicas: whether it left out any the filters match
(``true`` or ``false``); servers before it send nothing."""
_SAID = {"true": True, "false": False}
"""The header's values; any other says nothing."""

ListedReplica = Listed[ReplicaSummary]


@dataclass(frozen=True)
class ReplicaListing:
    """The replicas listed, and whether ended ones the filters match were left out."""

    replicas: list[ListedReplica]
    ended_left_out: bool | None
    """False with the ended ones asked for, or where the server said none was left out;
    None where it did not say (a server before ``X-Ended-Replicas-Left-Out``)."""


_replica_decoder = msgspec.json.Decoder(ReplicaSummary)
_raw_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])


def list_replicas(
    client: AdminClient, filters: Mapping[str, str], *, ended: bool
) -> ReplicaListing:
    """The replicas ``filters`` (``model``, ``node``, ``phase``) match, by model and
    number, ended ones too when ``ended``, each with its JSON as the API sent it."""
    asked = dict(filters) if ended else {**filters, "ended": "false"}
    try:
        replicas, first = _every_page(client, asked)
    except ApiProblem as problem:
        if not older_than_paging(problem):
            raise
    else:
        said = _SAID.get(first.headers.get(ENDED_LEFT_OUT_HEADER, "").strip().lower())
        return ReplicaListing(replicas, ended_left_out=False if ended else said)
    # Its one answer holds every replica the filters match: the ended ones are left out here.
    every = _replicas(_answer(client, filters))
    kept = [r for r in every if ended or r.view.phase not in ENDED_PHASES]
    return ReplicaListing(kept, ended_left_out=len(kept) < len(every))


def older_than_paging(problem: ApiProblem) -> bool:
    """Whether ``problem`` is a server older than paging refusing the paging parameters (a
    400 naming only them: ``after, limit: not a query parameter of /admin/v1/replicas``)."""
    named, refused, _ = str(problem).partition(NOT_A_QUERY_PARAMETER)
    if problem.status != 400 or not refused:
        return False
    return {name.strip() for name in named.split(",")} <= PAGING_PARAMETERS


def _every_page(
    client: AdminClient, filters: Mapping[str, str]
) -> tuple[list[ListedReplica], Answer]:
    """Every page's replicas, and the first page's answer."""
    replicas: list[ListedReplica] = []
    seen: set[str] = set()
    params: dict[str, str | int] = {**filters, "limit": REPLICAS_PAGE_SIZE}
    first: Answer | None = None
    for pages in itertools.count(1):
        check_page_count(client, pages, "replica list", REPLICAS_PAGE_SIZE, "replicas")
        answer = _answer(client, params)
        first = first or answer
        page = _replicas(answer)
        check_no_repeats(client, page, seen, "replica list", "replica")
        replicas += page
        if len(page) != REPLICAS_PAGE_SIZE:
            break
        params = {**filters, "limit": REPLICAS_PAGE_SIZE, "after": page[-1].view.id}
    assert first is not None  # the loop reads a page at least
    return replicas, first


def _answer(client: AdminClient, params: Mapping[str, str | int]) -> Answer:
    return client.request_answer("GET", f"{ADMIN}/replicas", params=params)


def _replicas(answer: Answer) -> list[ListedReplica]:
    """One page of the replica list: its array is split into replicas as sent, and each
    decoded once."""
    replicas: list[msgspec.Raw] = decode(_raw_list_decoder, answer.body, "replica list")
    return listed_items(_replica_decoder, replicas, "replica list")
