"""``GuardedController``: the guards every admin resource that operators read and change
runs before its handlers, in this order: who calls (``app.admin.auth.require_actor``), then
what they sent, the body (``app.admin.bodies``) and the query string
(``app.admin.queries``).

A resource's controller subclasses it and declares its own path and tags. The log's readers
(``app.admin.events``, ``app.admin.history``) list their guards themselves.
"""

from __future__ import annotations

from litestar import Controller

from app.admin.auth import require_actor
from app.admin.bodies import check_body
from app.admin.queries import check_query


class GuardedController(Controller):
    guards = [require_actor, check_body, check_query]
