"""Request paths whose segments are not the ones the client wrote are refused (404).

Litestar routes on the decoded path with its empty segments dropped, so
``DELETE /admin/v1/models//autoscale`` (a client that put an empty name in the path) would
remove the model named ``autoscale``, and ``DELETE /admin/v1/models/x%2Fautoscale`` (a name
holding a ``/``) would turn off the autoscaling of model ``x``. No name or id of llmgw is
empty or holds a ``/``, so such a path names nothing: it is answered 404, as any path that
names nothing is, before a guard or handler runs.

The check reads the raw path, as the client sent it: Litestar has already rewritten
``path`` by the time an app's middleware runs. (Where the collapsed path names a route that
does not take the method, Litestar answers 405 before this runs: nothing is done either
way.)
"""

from __future__ import annotations

from litestar.enums import ScopeType
from litestar.exceptions import NotFoundException
from litestar.types import ASGIApp, Receive, Scope, Send

_ENCODED_SLASH = b"%2f"


def split_segment(raw_path: bytes) -> str | None:
    """Why ``raw_path`` cannot be routed as written, or None when it can."""
    if b"//" in raw_path:
        return "the path has an empty segment (//): no resource is named by nothing"
    if _ENCODED_SLASH in raw_path.lower():
        return "a path segment holds an encoded '/' (%2F): no name or id holds one"
    return None


def refuse_split_paths(app: ASGIApp) -> ASGIApp:
    """Middleware: 404 for a path that ``split_segment`` refuses."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP:
            reason = split_segment(scope.get("raw_path") or b"")
            if reason is not None:
                raise NotFoundException(reason)
        await app(scope, receive, send)

    return middleware
