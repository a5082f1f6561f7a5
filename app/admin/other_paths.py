"""Which operations of the admin API a 405 can answer, for its OpenAPI schema
(``app.admin.operation_schema``).

A method a path does not take is answered 405 (``app.admin.errors``), and no operation of
the schema sends one to its own path: but Litestar routes a request on its path decoded
(``%2F`` is a ``/``) with empty segments dropped, before the app's middleware refuses such
a path (``app.admin.middleware``), so a path parameter that is empty or holds an encoded
``/`` can make the path another route's. Where that route does not take the method, the
router answers 405 first: ``POST /admin/v1/models//preview`` is routed as
``/admin/v1/models/preview``, model ``preview``'s path, which takes no ``POST``, and
``GET /admin/v1/replicas/x%2Fdrain`` as a replica's drain, which takes only ``POST``.
Elsewhere the same path is the 404 of a path that names nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from urllib.parse import quote

from litestar.routes import HTTPRoute

Segment = str | None
"""A path's segment as its route writes it: the text itself, or None for a parameter."""
FILLER = "0"
"""What a witness puts in another route's parameter: a name or id, and a GPU's index too."""


def segments(path_format: str) -> tuple[Segment, ...]:
    """``/admin/v1/models/{name}`` as ``("admin", "v1", "models", None)``."""
    return tuple(None if part.startswith("{") else part for part in path_format.split("/") if part)


def read_as(path: Sequence[Segment], other: Sequence[Segment]) -> str | None:
    """A request path of ``path`` that is routed as one of ``other`` (whose parameters are
    one segment each), a parameter of ``path`` at least given a value that is empty or
    holds an encoded ``/``; None when there is none. (With every value one segment, the
    request is ``path``'s own.)"""
    found = _spans(tuple(path), tuple(other), 0, 0, odd=False)
    if found is None:
        return None
    written = [
        quote("/".join(span), safe="") if segment is None else segment
        for segment, span in zip(path, found, strict=True)
    ]
    return "/" + "/".join(written)


def _spans(
    path: tuple[Segment, ...], other: tuple[Segment, ...], at: int, into: int, *, odd: bool
) -> list[list[str]] | None:
    """For each of ``path[at:]``'s segments, the segments of ``other[into:]`` it stands
    for: a parameter any number of them (none: it is empty), any other segment one, the
    same text or a parameter of ``other`` given it. ``odd``: whether a parameter before
    ``at`` stands for other than one segment, as one at least must."""
    if at == len(path):
        return [] if into == len(other) and odd else None
    segment = path[at]
    if segment is not None:
        if into == len(other) or other[into] not in (None, segment):
            return None
        rest = _spans(path, other, at + 1, into + 1, odd=odd)
        return None if rest is None else [[segment], *rest]
    for end in range(into, len(other) + 1):
        rest = _spans(path, other, at + 1, end, odd=odd or end != into + 1)
        if rest is not None:
            return [[FILLER if s is None else s for s in other[into:end]], *rest]
    return None


def answered_405(
    route: HTTPRoute, method: str, routes: Iterable[HTTPRoute]
) -> tuple[str, HTTPRoute] | None:
    """A request path of ``route`` that the router reads as another of ``routes`` that
    does not take ``method`` (a ``HEAD`` is taken as its path's ``GET``), and that route;
    None when no such path is. Litestar prefers a segment written as text to a parameter,
    so such a path could in principle be routed to a third route that takes the method:
    ``tests/integration/test_admin_schema_any_route.py`` sends each one found to the app."""
    path = segments(route.path_format)
    if None not in path:
        return None
    asked = "GET" if method == "HEAD" else method
    for other in routes:
        if other is route or asked in other.methods:
            continue
        witness = read_as(path, segments(other.path_format))
        if witness is not None:
            return witness, other
    return None
