"""What the admin API's OpenAPI schema says of each operation beyond what Litestar reads
from its handler:

- the ``Idempotency-Key`` header, on each change that reads it (``app.admin.idempotency_header``):
  the changes whose handler takes the ``caller``, which is where the header is read. A POST
  that only previews (a model's preview, a placement dry run) takes none, and neither reads
  nor declares it;
- a request body that may be left out, as not required. Litestar marks every body it reads
  required, whatever the handler's ``data`` defaults to, so the schema said a drain, an
  uncordon or a model's removal needed a body that none of them does
  (``app.admin.bodies``): a client made from the schema would refuse to send them without
  one. A body without a default stays required;
- the body of a handler that reads it by hand (a model spec, ``app.admin.models``), which
  Litestar cannot see: without ``body_read_by_hand`` the schema offered those requests no
  body at all, and a client made from it could not send a spec;
- a 400, on every operation, as the problem document the API writes
  (``app.admin.errors.ValidationProblem``). Litestar described its own, which the API never
  sends (``status_code``, ``extra``, as ``application/json``), and only where the handler
  takes a parameter; any request is a 400 with a query parameter it does not take;
- every other refusal an operation can meet, each as the problem document the API writes
  (``app.admin.problem_schemas``), by one rule per status (``REFUSALS``) read from the
  route and its handler, not from a list of routes: 401, 403 and 429 where the caller is
  checked (``require_actor``), 404 where the path names something, 409 and 422 for a
  change, 422 for a spec, 503 for a request that reads the store; and those no rule finds,
  which their handler declares (``refusal``). Without them a client generated from the
  schema took a wrong token, an unknown model or a conflicting change for an answer the
  API never gives;
- the answers any request may get, whatever its route: a 408, a 413 or a 431 from the
  listener, before the app sees the request (``app.listeners.limits``, written by
  ``app.admin.errors.problem_body``): the listener refuses a ``Content-Length`` over
  ``MAX_BODY_BYTES`` whatever the method, a ``GET``'s too, and the app refuses a body sent
  without one as it reads it (a ``POST``, ``PUT``, ``PATCH`` or ``DELETE``'s: no other
  is read, ``app.admin.bodies``); and a 500 for an error the server did not expect
  (``app.admin.errors.handle_domain``); and a 405, with its ``Allow`` header, where a path
  parameter that is empty or holds an encoded ``/`` makes the path another route's, which
  does not take the method (``app.admin.other_paths``). A client generated from a schema
  without them met each as an answer it had no type for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import msgspec
from litestar import Litestar
from litestar.di import Provide
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import (
    OpenAPIHeader,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    RequestBody,
    Schema,
)
from litestar.routes import HTTPRoute

from app.admin.auth import require_actor
from app.admin.bodies import MAX_BODY_BYTES
from app.admin.errors import PROBLEM_MEDIA_TYPE, ValidationProblem
from app.admin.idempotency_header import CALLER_PARAMETER, CHANGING_METHODS, SCHEMA_PARAMETER
from app.admin.other_paths import answered_405
from app.admin.problem_schemas import (
    ConflictProblem,
    InvalidFieldsProblem,
    Problem,
    UnknownThingProblem,
)
from app.listeners.limits import DEFAULT_MAX_HEADER_BYTES

BODY_PARAMETER = "data"
"""The handler parameter Litestar reads the request body into."""
HAND_READ_BODY = "body_read_by_hand"
"""The dependency that declares the body of a handler that reads it by hand."""
VALIDATION_RESPONSE = ResponseSpec(
    data_container=ValidationProblem,
    media_type=PROBLEM_MEDIA_TYPE,
    description="The request has the wrong shape: a body, a parameter or a header, each "
    "field to blame in errors (docs/admin-api.md, Errors)",
    generate_examples=False,
)
STORE_READERS = frozenset({"store", "operations", "traffic", "readiness", "cluster_metrics"})
"""The app's dependencies that read the store's database: a handler that takes one meets
the store's refusals (``app.admin.errors.PROBLEM_TABLE``, 503)."""
ALLOW_HEADER = OpenAPIHeader(
    schema=Schema(type=OpenAPIType.STRING),
    description="The methods the path takes (OPTIONS, GET, HEAD, say); detail names them too",
    required=True,
)
"""What a 405 says besides its problem document."""


def refusal(shape: type[msgspec.Struct], description: str) -> ResponseSpec:
    """The refusal ``description`` says, as the problem document of ``shape``
    (``app.admin.problem_schemas``). A refusal that no rule of ``REFUSALS`` finds is
    declared by its handler, in its ``responses``, which the rules' own do not replace: a
    404 for a thing a query parameter names, a 409 for a read that the cluster's state
    refuses."""
    return ResponseSpec(
        data_container=shape,
        media_type=PROBLEM_MEDIA_TYPE,
        description=description,
        generate_examples=False,
    )


@dataclass(frozen=True)
class Refusal:
    """A status that an operation is answered with when ``answers`` says its route and
    handler can meet the refusal, and the problem document it comes as."""

    status: int
    answers: Callable[[HTTPRoute, HTTPRouteHandler], bool]
    response: ResponseSpec


def checks_the_caller(_: HTTPRoute, handler: HTTPRouteHandler) -> bool:
    """Guarded by ``require_actor``: a token or an operator certificate is needed."""
    return any(require_actor in (layer.guards or ()) for layer in handler.ownership_layers)


def names_something(route: HTTPRoute, _: HTTPRouteHandler) -> bool:
    """Its path holds a parameter (a model's name, a drain's id): one may name nothing, and
    so may a path with an empty segment or an encoded ``/`` (``app.admin.middleware``)."""
    return bool(route.path_parameters)


def changes(_: HTTPRoute, handler: HTTPRouteHandler) -> bool:
    """Records a change (it takes the ``caller``): decided on the cluster as it is, appended
    only if no change came first (``Operations._append``), its ``Idempotency-Key`` checked
    against the request it was first sent with."""
    return CALLER_PARAMETER in handler.parsed_fn_signature.parameters


def changes_or_reads_a_spec(route: HTTPRoute, handler: HTTPRouteHandler) -> bool:
    """A change, or a model spec read by hand (``app.admin.models``): its fields are
    checked after it decodes."""
    return changes(route, handler) or HAND_READ_BODY in handler.resolve_dependencies()


def reads_the_store(_: HTTPRoute, handler: HTTPRouteHandler) -> bool:
    """Takes a dependency that reads the database, which may not answer; a change may find
    this server no longer the leader."""
    return not STORE_READERS.isdisjoint(handler.parsed_fn_signature.parameters)


def may_be_another_path(route: HTTPRoute, handler: HTTPRouteHandler) -> bool:
    """A path parameter that is empty or holds an encoded ``/`` can make its path one of
    another route of the app, which does not take the method (``app.admin.other_paths``)."""
    routes = [r for r in handler.app.routes if isinstance(r, HTTPRoute)]
    return any(answered_405(route, method, routes) for method in handler.http_methods)


def anywhere(_: HTTPRoute, __: HTTPRouteHandler) -> bool:
    """Any request: the listener answers it before the app sees it, or the app does
    whatever the route."""
    return True


REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        401,
        checks_the_caller,
        refusal(
            Problem,
            "No operator certificate and no admin token, or a wrong one "
            "(Authorization: Bearer <admin token>)",
        ),
    ),
    Refusal(
        403,
        checks_the_caller,
        refusal(
            Problem,
            "The client certificate is not an operator's, or has expired (HTTPS only)",
        ),
    ),
    Refusal(
        404,
        names_something,
        refusal(
            UnknownThingProblem,
            "What the path names does not exist (unknown-model, unknown-node, ...; id "
            "says which), or a path segment is empty or holds an encoded /",
        ),
    ),
    Refusal(
        405,
        may_be_another_path,
        refusal(
            Problem,
            "The path does not take the method (method-not-allowed; Allow names those it "
            "takes): a path parameter that is empty or holds an encoded / makes the path "
            "another one's",
        ),
    ),
    Refusal(
        408,
        anywhere,
        refusal(
            Problem,
            "The headers or the body did not arrive in time (request-timeout, from the "
            "listener); the connection is closed",
        ),
    ),
    Refusal(
        409,
        changes,
        refusal(
            ConflictProblem,
            "The change does not fit the cluster as it is (invalid-operation, "
            "no-room-to-drain, carried-out-already), or another change came first "
            "(conflict: conflicts_with names it); nothing was recorded",
        ),
    ),
    Refusal(
        413,
        anywhere,
        refusal(
            Problem,
            f"The request body is over {MAX_BODY_BYTES} bytes (1 MiB) "
            "(request-entity-too-large): refused by the listener, before the app sees the "
            "request, when its Content-Length says so, whatever the method (a GET's too), "
            "and the connection is closed; by the app as it reads a body sent without one",
        ),
    ),
    Refusal(
        422,
        changes_or_reads_a_spec,
        refusal(
            InvalidFieldsProblem,
            "A value cannot be (invalid-spec, invalid-drain, invalid-text, ...: errors "
            "names each field), or the Idempotency-Key was sent before with another "
            "request (idempotency-key-reused); nothing was recorded",
        ),
    ),
    Refusal(
        429,
        checks_the_caller,
        refusal(
            Problem,
            "Too many wrong tokens from this address: retry after Retry-After seconds "
            "(an operator certificate is not held up)",
        ),
    ),
    Refusal(
        431,
        anywhere,
        refusal(
            Problem,
            f"The headers are over {DEFAULT_MAX_HEADER_BYTES // 1024} KiB "
            "(request-header-fields-too-large, from the listener); the connection is closed",
        ),
    ),
    Refusal(
        500,
        anywhere,
        refusal(
            Problem,
            "An error the server did not expect (internal-error; store-error for a database "
            "fault that is no outage): the server's log says what",
        ),
    ),
    Refusal(
        503,
        reads_the_store,
        refusal(
            Problem,
            "The database is unavailable (database-unavailable), this server is not the "
            "leader (not-leader), its clock is off (clock-off), a change's outcome is "
            "unknown (outcome-unknown), or the listener holds as many connections as it "
            "takes: retry",
        ),
    ),
)
"""Each refusal besides a 400, and each error, in the order of its status."""


def refusals(route: HTTPRoute, handler: HTTPRouteHandler) -> dict[int, ResponseSpec]:
    """The refusals ``handler``, at ``route``, can be answered with."""
    return {r.status: r.response for r in REFUSALS if r.answers(route, handler)}


def body_read_by_hand(body: type[msgspec.Struct]) -> dict[str, Provide]:
    """The ``dependencies`` of a handler that reads its body by hand into ``body``, so that
    the schema declares it: its required JSON body, ``body``'s component.

    Litestar documents the body that a handler's dependencies read as well as its own. This
    one is never called, as no handler asks for it by name: the body is read as the handler
    reads it, with its own errors, and by nothing else."""

    async def declares_the_body(data: Any) -> None:
        raise AssertionError("declares a body in the schema; never called")

    declares_the_body.__annotations__["data"] = body
    return {HAND_READ_BODY: Provide(declares_the_body)}


@cache
def operation_class(*, reads_idempotency_key: bool, body_optional: bool) -> type[Operation]:
    """Litestar's operation, with the header declared and the body's need said as asked,
    and a 405's ``Allow`` (a ``ResponseSpec`` declares no header)."""

    @dataclass
    class AdminOperation(Operation):
        def __post_init__(self) -> None:
            if reads_idempotency_key:
                self.parameters = [*(self.parameters or []), SCHEMA_PARAMETER]
            if body_optional and isinstance(self.request_body, RequestBody):
                self.request_body = replace(self.request_body, required=False)
            method_not_allowed = (self.responses or {}).get("405")
            if isinstance(method_not_allowed, OpenAPIResponse):
                headers = {**(method_not_allowed.headers or {}), "Allow": ALLOW_HEADER}
                method_not_allowed.headers = headers

    return AdminOperation


def reads_idempotency_key(handler: HTTPRouteHandler) -> bool:
    changes = handler.http_methods <= CHANGING_METHODS
    return changes and CALLER_PARAMETER in handler.parsed_fn_signature.parameters


def body_optional(handler: HTTPRouteHandler) -> bool:
    """Whether a request to ``handler`` may come without a body: it reads one into a
    ``data`` that has a default."""
    data = handler.parsed_fn_signature.parameters.get(BODY_PARAMETER)
    return data is not None and data.has_default


def declare_in_schema(app: Litestar) -> None:
    """Says in ``app``'s OpenAPI schema what Litestar does not; before the schema is first
    served (Litestar builds it then)."""
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            handler.responses = {
                **refusals(route, handler),
                **(handler.responses or {}),
                400: VALIDATION_RESPONSE,
            }
            key, optional = reads_idempotency_key(handler), body_optional(handler)
            handler.operation_class = operation_class(
                reads_idempotency_key=key, body_optional=optional
            )
