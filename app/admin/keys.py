"""``/admin/v1/keys``: create API keys (the key is shown once), list and revoke them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from litestar import delete, get, post
from litestar.datastructures import CacheControlHeader
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED

from app.admin.bodies import NoBody
from app.admin.guarded import GuardedController
from app.admin.key_schemas import KeyChange, KeyCreated, KeyRequest, KeyView
from app.admin.operation_schema import refusal
from app.admin.problem_schemas import UnknownThingProblem
from app.admin.schemas import as_view
from app.domain.keys import ALL_MODELS
from app.domain.state import ApiKey
from app.services.operations import Caller, Operations

MAX_KEYS_PER_PAGE = 5000
"""The largest ``limit`` of a page of keys, as of a page of history."""
MAX_KEY_ID_LENGTH = 64
"""Far longer than any key id (``k-`` and 8 hex characters): a longer ``after`` names none."""


def key_view(key: ApiKey, now: datetime) -> KeyView:
    return as_view(key, KeyView, **_shown(key, now))


def _shown(key: ApiKey, now: datetime) -> dict[str, object]:
    """The fields whose wire form differs from the record (the hash is dropped by
    ``KeyView`` not declaring it)."""
    return {
        "models": list(key.models) or [ALL_MODELS],
        "revoked": key.revoked_at is not None,
        "expired": key.expired(now),
    }


class KeyController(GuardedController):
    path = "/admin/v1/keys"
    tags = ["keys"]

    @post(
        "/",
        status_code=HTTP_201_CREATED,
        cache_control=CacheControlHeader(no_store=True),
        summary="Create an API key; the answer holds the whole key, this once",
        description="Only a hash of the key is stored: it cannot be shown again. A name "
        "already used by a live key (neither revoked nor expired) is refused (409); unknown "
        "models, limits below 1, an `expires_at` in the past, more than 10 years ahead or "
        "without a timezone, an `expires_in_s` not above 0 or over 10 years, or both "
        "`expires_at` and `expires_in_s` are refused (422) with every field and reason.",
    )
    async def create(
        self,
        data: JSONBody[KeyRequest],
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
    ) -> KeyCreated:
        new = await operations.create_key(
            caller,
            data.name,
            data.models,
            data.rpm,
            data.tpm,
            expires_at=data.expires_at,
            expires_in_s=data.expires_in_s,
        )
        shown = _shown(new.record, operations.now())
        return as_view(new.record, KeyCreated, **shown, key=new.key)

    @get(
        "/",
        summary="Every API key, revoked and expired ones too, oldest first (never a secret)",
        description="Without `limit`, every key in one answer. With `limit`, at most that many "
        "keys, after the key whose id is `after` when given: pass the last key's id as `after` "
        "for the next page; a page with fewer than `limit` keys is the last (a full one may "
        "be followed by an empty one). An `after` that names no key is refused (404).",
        responses={
            404: refusal(UnknownThingProblem, "No key has the id that after names (unknown-key)")
        },
    )
    async def list_keys(
        self,
        operations: NamedDependency[Operations],
        after: Annotated[
            str | None,
            QueryParameter(
                min_length=1,
                max_length=MAX_KEY_ID_LENGTH,
                description="list the keys after the one with this id",
            ),
        ] = None,
        limit: Annotated[
            int | None, QueryParameter(ge=1, le=MAX_KEYS_PER_PAGE, description="page size")
        ] = None,
    ) -> list[KeyView]:
        keys = await operations.list_keys(after=after, limit=limit)
        now = operations.now()
        return [key_view(key, now) for key in keys]

    @delete(
        "/{prefix_or_name:str}",
        status_code=HTTP_200_OK,
        summary="Revoke an API key by its prefix or its name; again records nothing",
    )
    async def revoke(
        self,
        operations: NamedDependency[Operations],
        caller: NamedDependency[Caller],
        prefix_or_name: FromPath[str],
        data: JSONBody[NoBody | None] = None,
    ) -> KeyChange:
        changed, key = await operations.revoke_key(caller, prefix_or_name)
        return KeyChange(changed=changed, key=key_view(key, operations.now()))
