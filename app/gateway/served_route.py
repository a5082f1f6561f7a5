"""What every route that passes a request to an engine does around reading and forwarding
it (``ServedRoute``): the request's id bound to every line logged while it is served, the
watch for a client that leaves, the answer to a refusal or a bug, and the accounting at the
end. A route (``app.gateway.completions`` for a JSON body, ``app.gateway.uploads`` for a
multipart upload) says only how it reads its request and forwards it (``handle``).

A request still open when the gateway's graceful shutdown ends is cancelled: one not
answered yet is answered 503 ``gateway_shutting_down`` and logged at warning, not as a
fault (its operator stopped the gateway), a stream ends with an error event
(``app.gateway.proxy``).

The route is the ASGI callable itself and calls ``handle`` directly: a request passes
through no coroutine more than its route's own.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod

import structlog

from app.gateway.asgi import Receive, Scope, Send, clock, refuse
from app.gateway.disconnect import DisconnectWatch
from app.gateway.errors import ApiError, gateway_stopped, internal_error
from app.gateway.exchange import CompletionExchange
from app.gateway.exchange_steps import ExchangeSteps, log
from app.gateway.metrics import CLIENT_GONE
from app.gateway.request_body import ClientGoneBeforeBody

UNANSWERED_AT_STOP = "still unanswered when the gateway's shutdown grace ran out"


class ServedRoute(ABC):
    """An ASGI route serving requests by ``steps``; subclasses read and forward them
    (``handle``)."""

    def __init__(self, steps: ExchangeSteps) -> None:
        self.steps = steps

    @abstractmethod
    async def handle(
        self,
        exchange: CompletionExchange,
        watch: DisconnectWatch,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Read the request, admit it and forward it; ``watch`` is started once the client
        leaving should cancel it. Raises ``ApiError`` for a refusal."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        steps = self.steps
        exchange = CompletionExchange(clock())
        # Every line logged while serving the request carries its id, as its answer does.
        # Bound and reset by token: ``bound_contextvars`` would also read the whole context
        # first, to restore an outer value that a request's own task never has.
        tokens = structlog.contextvars.bind_contextvars(request_id=exchange.request_id.decode())
        task = asyncio.current_task(steps.loop)
        assert task is not None
        watch = DisconnectWatch(task)
        try:
            await self.handle(exchange, watch, scope, receive, send)
        except ApiError as error:
            watch.stop()
            exchange.status = error.status
            if not exchange.answer_started:
                await refuse(send, error, exchange.answer_headers())
        except ClientGoneBeforeBody:
            exchange.status = CLIENT_GONE
        except asyncio.CancelledError:
            if not watch.left():
                # The gateway stops, past its grace: a client still waiting is told so
                # (a stream's relay ends it with an error event of its own).
                if not exchange.answer_started:
                    exchange.status = 503
                    exchange.note = UNANSWERED_AT_STOP
                    # Its operator stopped the gateway: no fault, but requests longer
                    # than the grace are worth a look.
                    exchange.log_level = logging.WARNING
                    await refuse(send, gateway_stopped(), exchange.answer_headers())
                raise
            exchange.status = CLIENT_GONE
        except Exception:
            # A bug, not a client's or an engine's doing: logged with its traceback, and
            # answered in OpenAI's shape if the answer has not started yet.
            watch.stop()
            log.exception("gateway_request_failed")
            exchange.status = 500
            if not exchange.answer_started:
                await refuse(send, internal_error(), exchange.answer_headers())
        finally:
            watch.stop()
            steps.finish(exchange)
            structlog.contextvars.reset_contextvars(**tokens)
