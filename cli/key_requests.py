"""The admin API's keys as llmgw-cli asks for them: create one, list them all page after
page (never trusting a listing that repeats itself), revoke one.

A key creation whose answer was lost, sent again with its Idempotency-Key, is answered 409
``carried-out-already`` naming the key it created: that key's secret was only in the lost
answer, and the server never shows it again. Nobody holds it, so nobody can be using the
key: ``create_key`` revokes it and creates another in its place (``Created.replaced``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

import msgspec

from cli.arguments import segment
from cli.client import AdminClient, ApiProblem, ClientError, decode
from cli.operator import Reply
from cli.paging import Listed, check_no_repeats, check_page_count, listed_items

KEYS_PAGE_SIZE = 500
CARRIED_OUT_ALREADY = "carried-out-already"
MAX_KEY_ID_CHARS = 128
"""The longest key id a ``carried-out-already`` answer may name for llmgw-cli to revoke it."""


class KeyView(msgspec.Struct, frozen=True, kw_only=True):
    """An API key as ``/admin/v1/keys`` lists it (never its secret)."""

    id: str
    prefix: str
    name: str
    models: list[str] = []
    """``["*"]`` when the key may use every model."""
    rpm: int | None = None
    tpm: int | None = None
    created_at: datetime
    created_by: str = ""
    revoked: bool = False
    revoked_at: datetime | None = None
    revoked_by: str | None = None
    expires_at: datetime | None = None
    """None: the key never expires (or the server is older than expiring keys)."""
    expired: bool = False
    """Whether the key had expired by the server's clock when it answered."""


class KeyCreated(KeyView, frozen=True, kw_only=True):
    key: str
    """The whole key: the server shows it this once."""


class KeyChange(msgspec.Struct, frozen=True, kw_only=True):
    changed: bool
    key: KeyView


ListedKey = Listed[KeyView]


@dataclass(frozen=True)
class Created:
    """A key creation's answer, and the id of the key revoked in its place, if any: one
    created by the same request, whose answer (and secret) was lost."""

    reply: Reply[KeyCreated]
    replaced: str | None = None


_key_created_decoder = msgspec.json.Decoder(KeyCreated)
_key_decoder = msgspec.json.Decoder(KeyView)
_raw_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_key_change_decoder = msgspec.json.Decoder(KeyChange)


def create_key(
    client: AdminClient,
    name: str,
    models: list[str],
    *,
    rpm: int | None = None,
    tpm: int | None = None,
    expires_at: datetime | None = None,
    expires_in_s: float | None = None,
) -> Created:
    """A new API key scoped to ``models`` (``["*"]``: every model) that works until
    ``expires_at``, or for ``expires_in_s`` seconds from when the server records it, by the
    server's clock (neither: until revoked); the answer holds the whole key, which the
    server never shows again. When the key was created but its answer lost, that key is
    revoked and another created, once."""
    body: dict[str, object] = {"name": name, "models": models, "rpm": rpm, "tpm": tpm}
    # Each left out unless given: a server older than it refuses it.
    if expires_at is not None:
        body["expires_at"] = expires_at
    if expires_in_s is not None:
        body["expires_in_s"] = expires_in_s

    def create() -> Reply[KeyCreated]:
        raw = client.request("POST", "/admin/v1/keys", body=body)
        return Reply(decode(_key_created_decoder, raw, "new key"), raw)

    try:
        return Created(create())
    except ApiProblem as problem:
        lost = secret_lost(problem)
        if lost is None:
            raise
    return Created(_in_place_of(client, lost, create), replaced=lost)


def secret_lost(problem: ApiProblem) -> str | None:
    """The id of the key a creation sent again had created, whose secret was only in the
    lost answer; None when ``problem`` is not that (or names no usable id)."""
    if problem.status != 409 or problem.title != CARRIED_OUT_ALREADY:
        return None
    key_id = problem.extra.get("key_id")
    if not isinstance(key_id, str) or not 0 < len(key_id) <= MAX_KEY_ID_CHARS:
        return None
    return key_id if key_id.isprintable() and not key_id.isspace() else None


def lost_words(key_id: str) -> str:
    return f"key {key_id} was created but its secret was lost with the answer"


def _in_place_of(
    client: AdminClient, lost: str, create: Callable[[], Reply[KeyCreated]]
) -> Reply[KeyCreated]:
    """``create`` once ``lost`` is revoked; a failure of either says where it stopped."""
    try:
        revoke_key(client, lost)
    except ClientError as exc:
        raise ClientError(
            f"{lost_words(lost)}, and revoking it failed: {exc}. Revoke it "
            f"(`llmgw-cli keys revoke {lost}`) and create another"
        ) from exc
    try:
        return create()
    except ClientError as exc:
        raise ClientError(
            f"{lost_words(lost)}: it was revoked, and creating another in its place failed: {exc}"
        ) from exc


def list_keys(client: AdminClient) -> list[ListedKey]:
    """Every API key, oldest first, read page after page, each with its JSON as the API
    sent it."""
    keys: list[ListedKey] = []
    seen: set[str] = set()
    params: dict[str, int | str] = {"limit": KEYS_PAGE_SIZE}
    for pages in itertools.count(1):
        check_page_count(client, pages, "key list", KEYS_PAGE_SIZE, "keys")
        page = _key_page(client, params)
        if pages == 2 and _ids(page[: len(keys)]) == _ids(keys):
            # A server older than paging answers every key to every request, so its first
            # answer of a whole page's length is followed by the same keys again (and any
            # created since): this answer is every key.
            return page
        check_no_repeats(client, page, seen, "key list", "key")
        keys += page
        if len(page) != KEYS_PAGE_SIZE:
            break
        params = {"limit": KEYS_PAGE_SIZE, "after": page[-1].view.id}
    return keys


def _key_page(client: AdminClient, params: Mapping[str, int | str]) -> list[ListedKey]:
    """One page of the key list: its array is split into keys as sent, and each decoded
    once."""
    raw = client.request("GET", "/admin/v1/keys", params=params)
    keys: list[msgspec.Raw] = decode(_raw_list_decoder, raw, "key list")
    return listed_items(_key_decoder, keys, "key list")


def revoke_key(client: AdminClient, prefix_or_name: str) -> Reply[KeyChange]:
    path = f"/admin/v1/keys/{segment(prefix_or_name, 'the key prefix or name')}"
    raw = client.request("DELETE", path)
    return Reply(decode(_key_change_decoder, raw, "revoked key"), raw)


def _ids(keys: list[ListedKey]) -> list[str]:
    return [key.view.id for key in keys]


def repeated_models(scope: list[str]) -> list[str]:
    """What is wrong with each model ``scope`` names more than once, as the API says it
    (``'demo' is listed twice (1st and 2nd)``), counting from 1 as an operator reads a
    list: said before anything is sent, and nothing is."""
    places: dict[str, list[int]] = {}
    for number, model in enumerate(scope, start=1):
        places.setdefault(model, []).append(number)
    reasons = []
    for model, at in places.items():
        if len(at) > 1:
            times = "twice" if len(at) == 2 else f"{len(at)} times"
            where = [_ordinal(number) for number in at]
            listed = f"{', '.join(where[:-1])} and {where[-1]}"
            reasons.append(f"{model!r} is listed {times} ({listed}): list each model once")
    return reasons


def _ordinal(number: int) -> str:
    suffix = (
        "th" if 11 <= number % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    )
    return f"{number}{suffix}"
