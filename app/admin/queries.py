"""Query strings of the admin API, checked before a handler sees them.

``check_query``, a guard that runs after the caller's identity is known, refuses a query
parameter the handler does not take (400 naming it, and the ones the path takes). Litestar
ignores such a parameter, so ``GET /admin/v1/replicas?modle=llama`` answered every replica
of every model, as if the filter had been read: a script that acted on the answer acted on
all of them. So is one sent more than once (``?model=a&model=b``): Litestar reads one of
them, and the answer would be of a filter the caller did not know it asked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import ValidationException
from litestar.handlers.base import BaseRouteHandler

_NOT_QUERY = frozenset(
    {"data", "request", "scope", "state", "headers", "cookies", "query", "socket", "body"}
)
"""Parameters Litestar fills from the request itself, never from its query string."""


def query_parameters(handler: BaseRouteHandler, path_parameters: set[str]) -> set[str]:
    """The names of the query parameters ``handler`` reads."""
    named = set(handler.parsed_fn_signature.parameters)
    return named - set(handler.resolve_dependencies()) - path_parameters - _NOT_QUERY


async def check_query(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Guard: every query parameter sent is one the handler reads, and is sent once."""
    query = connection.query_params
    sent = set(query)
    if not sent:
        return
    taken = query_parameters(handler, set(connection.path_params))
    unknown = sorted(sent - taken)
    if not unknown:
        _refuse_repeated(query.multi_items())
        return
    takes = ", ".join(sorted(taken)) if taken else "no query parameter"
    raise ValidationException(
        f"{', '.join(unknown)}: not a query parameter of {connection.url.path} (it takes {takes})",
        extra=[
            {"key": name, "message": "is not a query parameter of this request", "source": "query"}
            for name in unknown
        ],
    )


def _refuse_repeated(items: Iterable[tuple[str, Any]]) -> None:
    """400 naming every query parameter sent more than once, and how many times."""
    counts: dict[str, int] = {}
    for name, _ in items:
        counts[name] = counts.get(name, 0) + 1
    repeated = sorted(name for name, count in counts.items() if count > 1)
    if not repeated:
        return
    said = ", ".join(f"{name} ({counts[name]} times)" for name in repeated)
    raise ValidationException(
        f"{said}: a query parameter is given once",
        extra=[
            {"key": name, "message": "is given more than once", "source": "query"}
            for name in repeated
        ],
    )
