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
  takes a parameter; any request is a 400 with a query parameter it does not take.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import msgspec
from litestar import Litestar
from litestar.di import Provide
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import Operation, RequestBody
from litestar.routes import HTTPRoute

from app.admin.errors import PROBLEM_MEDIA_TYPE, ValidationProblem
from app.admin.idempotency_header import CALLER_PARAMETER, CHANGING_METHODS, SCHEMA_PARAMETER

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
    """Litestar's operation, with the header declared and the body's need said as asked."""

    @dataclass
    class AdminOperation(Operation):
        def __post_init__(self) -> None:
            if reads_idempotency_key:
                self.parameters = [*(self.parameters or []), SCHEMA_PARAMETER]
            if body_optional and isinstance(self.request_body, RequestBody):
                self.request_body = replace(self.request_body, required=False)

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
            handler.responses = {**(handler.responses or {}), 400: VALIDATION_RESPONSE}
            key, optional = reads_idempotency_key(handler), body_optional(handler)
            if key or optional:
                handler.operation_class = operation_class(
                    reads_idempotency_key=key, body_optional=optional
                )
