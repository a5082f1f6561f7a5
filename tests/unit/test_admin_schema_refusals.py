"""The admin API's OpenAPI schema lists each refusal an operation can meet besides a 400
(``app.admin.operation_schema.REFUSALS``), as the problem document the API writes for it. A
client generated from a schema without them took a wrong token (401), an unknown model
(404), a change that lost a race (409) or an invalid spec (422) for an answer the API never
gives, and had no type to read its fields with.

The routes and the schema are the app's own, as ``create_admin_app`` builds them (no
database is reached: nothing is served)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, cast

import msgspec
import pytest
from litestar import Request
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotAuthorizedException,
    NotFoundException,
    PermissionDeniedException,
    TooManyRequestsException,
)
from litestar.types import Scope

from app.admin.errors import handle_domain, handle_http, problem_body
from app.domain.drain_room import ReplicaRoom
from app.domain.envelope import Meta, Recorded
from app.domain.events import NodeCordoned
from app.domain.idempotency import KeyReused, KeyShownOnce
from app.domain.operation_results import InvalidSpec, NoRoomToDrain, UnknownModel
from app.domain.spec_error import SpecError
from app.services.conflicts import ChangeConflict
from app.store.errors import ConcurrencyError, FencedError, StoreError, StoreUnavailable
from tests.support.admin_routes import REFERENCE, admin_app, operations

PROBLEM = "application/problem+json"
ANY_REQUEST = {408, 413, 431, 500}
"""What any request can meet, whatever its route: headers or a body too slow, a body
announced too large (a GET's too), or headers too large, at the listener; an error the
server did not expect."""
GUARDED = {400, 401, 403, 429, 503} | ANY_REQUEST
"""What every request an operator sends can meet: a malformed one, no identity or a wrong
one, too many wrong tokens, a store that cannot answer, and what any request can."""
A_CHANGE = {404, 409, 413, 422}
ANOTHER_PATH = {405}
"""A path parameter that is empty or holds an encoded / makes the path another route's,
which does not take the method (``app.admin.other_paths``)."""


@pytest.mark.parametrize(
    ("operation", "refusals"),
    [
        ("GET /admin/v1/models", GUARDED),
        ("GET /admin/v1/events", GUARDED),
        # /admin/v1/models/x%2Fautoscale: a model's autoscaling, which takes no GET.
        ("GET /admin/v1/models/{name}", GUARDED | {404} | ANOTHER_PATH),
        # after: a key id, which may name none.
        ("GET /admin/v1/keys", GUARDED | {404}),
        # Reads the state refuses: a model that never had a rollout, a key's name that
        # more than one key has.
        ("GET /admin/v1/models/{name}/rollout", GUARDED | {404, 409}),
        ("GET /admin/v1/history/{subject}/{key}", GUARDED | {404, 409}),
        # /admin/v1/models/: the model list, which takes neither.
        ("PUT /admin/v1/models/{name}", GUARDED | A_CHANGE | ANOTHER_PATH),
        ("DELETE /admin/v1/models/{name}", GUARDED | A_CHANGE | ANOTHER_PATH),
        # /admin/v1/nodes//drain: the node named "drain", whose path takes no POST.
        ("POST /admin/v1/nodes/{node_id}/drain", GUARDED | A_CHANGE | ANOTHER_PATH),
        ("POST /admin/v1/keys", GUARDED | {409, 413, 422}),
        # Previews record nothing, so nothing conflicts; their spec may be invalid.
        ("POST /admin/v1/models/{name}/preview", GUARDED | {404, 413, 422} | ANOTHER_PATH),
        ("POST /admin/v1/placement", GUARDED | {413, 422}),
    ],
)
def test_each_operation_lists_the_refusals_it_can_meet(operation: str, refusals: set[int]) -> None:
    [described] = [o for o in operations(admin_app()) if str(o) == operation]

    listed = {int(code) for code in described.schema["responses"] if code[0] in "45"}

    assert listed == refusals


def test_every_refusal_is_a_problem_document_saying_when_it_comes() -> None:
    wrong: list[str] = []
    for operation in operations(admin_app()):
        for code, response in operation.schema["responses"].items():
            if code[0] not in "45":
                continue
            if set(response.get("content", {})) != {PROBLEM}:
                wrong.append(f"{operation}'s {code} is {PROBLEM}, says {response.get('content')}")
            if not response.get("description"):
                wrong.append(f"{operation}'s {code} says nothing of when it comes")

    assert wrong == []


def _request() -> Request[Any, Any, Any]:
    path = "/admin/v1/models/llama"
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode()}
    return Request(cast(Scope, scope))


def _cordoned() -> Recorded:
    return Recorded(
        position=7,
        stream="node-gpu-1",
        version=2,
        event_id=uuid.uuid4(),
        recorded_at=datetime(2026, 12, 1, 9, 0, tzinfo=UTC),
        meta=Meta(actor="alice"),
        event=NodeCordoned(node_id="gpu-1", reason="new firmware"),
    )


def _written_by_the_app(exc: Exception) -> tuple[int, dict[str, Any]]:
    request = _request()
    if isinstance(exc, HTTPException):
        answer = handle_http(request, exc)
    else:
        answer = handle_domain(request, exc)
    return answer.status_code, answer.content


def _written_by_the_listener(status: int) -> tuple[int, dict[str, Any]]:
    _, body = problem_body(status, "refused before the app saw the request")
    return status, msgspec.json.decode(body)


REFUSALS_WRITTEN = [
    _written_by_the_app(NotAuthorizedException("authentication required")),
    _written_by_the_app(PermissionDeniedException("the certificate is a node's")),
    _written_by_the_app(TooManyRequestsException("too many wrong tokens")),
    _written_by_the_app(NotFoundException("the path has an empty segment (//)")),
    _written_by_the_app(UnknownModel("llama")),
    _written_by_the_app(UnknownModel("x" * 300)),
    _written_by_the_app(ChangeConflict(ConcurrencyError("node-gpu-1", 1, 2), [_cordoned()])),
    _written_by_the_app(
        NoRoomToDrain(
            "gpu-1",
            [ReplicaRoom(replica_id="llama-1", model="llama", has_room=False, reason="full")],
        )
    ),
    _written_by_the_app(KeyShownOnce("key-0123")),
    _written_by_the_app(InvalidSpec("llama", [SpecError("replicas", "must be at least 0")])),
    _written_by_the_app(KeyReused("retry-1")),
    _written_by_the_app(StoreUnavailable("the database does not answer")),
    _written_by_the_app(FencedError(1, 2)),
    _written_by_the_app(MethodNotAllowedException(headers={"allow": "OPTIONS, GET"})),
    _written_by_the_app(RuntimeError("a bug")),
    _written_by_the_app(StoreError("the database refused the statement")),
    _written_by_the_listener(408),
    _written_by_the_listener(413),
    _written_by_the_listener(431),
    _written_by_the_listener(503),
]


@pytest.mark.parametrize(
    ("status", "document"), REFUSALS_WRITTEN, ids=[d["title"] for _, d in REFUSALS_WRITTEN]
)
def test_each_refusal_the_api_writes_has_the_shape_the_schema_lists(
    status: int, document: dict[str, Any]
) -> None:
    app = admin_app()
    schema = app.openapi_schema.to_schema()
    shapes = {
        operation.schema["responses"][str(status)]["content"][PROBLEM]["schema"]["$ref"]
        for operation in operations(app)
        if str(status) in operation.schema["responses"]
    }

    assert len(shapes) == 1, shapes
    assert _misfits(schema, shapes.pop(), document) == []


def _misfits(schema: dict[str, Any], reference: str, document: dict[str, Any]) -> list[str]:
    """What in ``document`` the component at ``reference`` does not describe: a field it
    lacks, one it does not know, an item of a list that fits its items' component no
    better."""
    component = schema["components"]["schemas"][reference.removeprefix(REFERENCE)]
    properties: dict[str, Any] = component["properties"]
    misfits = [f"{field} is missing" for field in component["required"] if field not in document]
    for field, value in document.items():
        if field not in properties:
            misfits.append(f"{field} is not described")
            continue
        listed = [s for s in properties[field].get("oneOf", []) if s.get("type") == "array"]
        for items in (s["items"] for s in listed if "$ref" in s["items"]):
            for item in value:
                misfits.extend(f"{field}: {m}" for m in _misfits(schema, items["$ref"], item))
    return misfits
