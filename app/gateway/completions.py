"""``POST /v1/chat/completions`` and ``POST /v1/completions``: the gateway's hot path; and
the other requests whose JSON body names the model (embeddings, responses, rerank, score,
tokenize, detokenize: ``app.gateway.endpoints``), served the same way.

A request costs one header scan and one SHA-256 for the key, one msgspec decode that reads
only ``model`` and ``stream`` (``app.gateway.request_body``: the body itself goes to the
engine byte for byte), the rate limiter, the router's choice, one write to the engine, and
one log line. What serving it takes beyond reading it (the limits, the relay, the
accounting) it shares with uploads: ``app.gateway.exchange_steps``, and the frame around
it (the refusals, the end of every request): ``app.gateway.served_route``.

A client that disconnects cancels its request, once the body is read
(``app.gateway.disconnect``).
"""

from __future__ import annotations

from app.gateway.affinity import SESSION_HEADER, route_key
from app.gateway.asgi import (
    AUTHORIZATION,
    Receive,
    Scope,
    Send,
    repeated_authorization,
)
from app.gateway.disconnect import DisconnectWatch
from app.gateway.endpoints import JSON_ENDPOINTS
from app.gateway.errors import body_too_large
from app.gateway.exchange import ROUTE_HEADER, CompletionExchange
from app.gateway.proxy import Opened
from app.gateway.request_body import (
    MAX_BODY_BYTES,
    parse_fields,
    read_body,
    token_estimate,
)
from app.gateway.route_refusals import RouteRefused
from app.gateway.served_route import ServedRoute
from app.gateway.table import KeyRecord
from app.listeners.limits import announces_more_than


class Completions(ServedRoute):
    """Serves requests whose JSON body names the model, by ``steps``."""

    async def handle(
        self,
        exchange: CompletionExchange,
        watch: DisconnectWatch,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        steps = self.steps
        snapshot = steps.snapshot()
        authorization, session, show_route, length = _request_headers(scope)
        key = exchange.key = steps.keys.check(snapshot, authorization, scope)
        if length is not None and announces_more_than(length, MAX_BODY_BYTES):
            # Before the body is asked for: a client that waits for 100 Continue to
            # send it gets none, and the body is never read.
            raise body_too_large(MAX_BODY_BYTES)
        exchange.body = await read_body(receive)
        fields = parse_fields(exchange.body)
        model = fields.model
        path: str = scope["path"]
        endpoint = JSON_ENDPOINTS[path]
        steps.check_model(snapshot, key, model, endpoint.api, path)
        exchange.model = model
        exchange.stream = bool(fields.stream)
        if key.tpm is not None:
            exchange.token_estimate = token_estimate(
                fields, len(exchange.body), generates=endpoint.generates
            )
        exchange.route_key = route_key(snapshot.policy_of(model), exchange.body, session)
        if show_route:
            exchange.route_header = b""
        # Watched from before admission: a client that leaves while its request waits
        # for a grant of its key's limits is neither charged nor forwarded.
        watch.start(scope, receive)
        await steps.admit(exchange, key)
        await self._forward(exchange, key, endpoint.engine_path, watch, send)

    async def _forward(
        self,
        exchange: CompletionExchange,
        key: KeyRecord,
        path: str,
        watch: DisconnectWatch,
        send: Send,
    ) -> None:
        await self.steps.relay(
            exchange,
            key,
            send,
            watch,
            lambda: self._open(exchange, key, path),
            lambda opened: exchange.stream and opened.answer.status == 200,
        )

    async def _open(self, exchange: CompletionExchange, key: KeyRecord, path: str) -> Opened:
        upstream = self.steps.started_upstream()
        model = exchange.model
        try:
            return await upstream.open(
                model,
                key.key_id,
                path,
                exchange.body,
                exchange.request_id.decode(),
                exchange.timing,
                exchange.route_key,
            )
        except RouteRefused as exc:
            raise self.steps.refused(exchange, exc) from None


def _request_headers(scope: Scope) -> tuple[bytes | None, bytes | None, bool, bytes | None]:
    """The request's ``Authorization`` (400 when it comes more than once:
    ``app.gateway.asgi.authorization_of``), its session id (``x-session-id``), whether it
    asks for the route (``x-llmgw-route`` set to anything but ``0``), and its
    ``Content-Length``: one walk of the headers for all four."""
    authorization: bytes | None = None
    session: bytes | None = None
    show = False
    length: bytes | None = None
    for name, value in scope["headers"]:
        if name == AUTHORIZATION:
            if authorization is not None:
                raise repeated_authorization()
            authorization = value
        elif name == SESSION_HEADER:
            session = value or None
        elif name == ROUTE_HEADER:
            show = value.strip() not in (b"", b"0")
        elif name == b"content-length":
            length = value
    return authorization, session, show, length
