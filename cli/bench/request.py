"""One streamed completion, timed from the client's side: time to first token (the first
event with text), time per output token (the rest of the answer over the tokens after the
first) and end to end.

A request that went out on a pooled connection which the engine had closed meanwhile is sent
again on another, as the gateway does: the engine never saw it. llama.cpp's server closes
every connection after a streamed answer although it offers keep-alive, so without this a
third of the requests to it would fail ("Can not write request body").
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from types import SimpleNamespace

import aiohttp
import msgspec

from cli.bench.errors import TargetUnreachable
from cli.bench.stats import RequestOutcome
from cli.bench.target import Engine
from cli.client import UNREADABLE

ERROR_BODY_BYTES = 2000


class RequestFailed(Exception):
    """One request failed; the level goes on and counts it."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Attempt:
    """One try of a request, told by aiohttp's trace whether its connection was pooled."""

    def __init__(self) -> None:
        self.reused = False


async def _mark_reused(
    _session: aiohttp.ClientSession,
    context: SimpleNamespace,
    _params: aiohttp.TraceConnectionReuseconnParams,
) -> None:
    attempt = context.trace_request_ctx
    if isinstance(attempt, _Attempt):
        attempt.reused = True


def engine_session() -> aiohttp.ClientSession:
    """The session bench talks to the engine with: connections kept alive, and each
    request's try told whether its connection was a pooled one."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_mark_reused)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=False),
        trust_env=False,
        trace_configs=[trace],
    )


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, timeout_s: float
) -> aiohttp.ClientResponse:
    """POST ``body``; its answer's head. A pooled connection the engine closed before
    answering is dropped and the request sent again, on the next pooled one or a new one:
    as many tries as there were stale connections in the pool, and no more."""
    while True:
        attempt = _Attempt()
        try:
            return await session.post(
                url,
                data=body,
                headers={"content-type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                trace_request_ctx=attempt,
            )
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if not attempt.reused:
                raise


class _Delta(msgspec.Struct, frozen=True):
    content: str | None = None


class _Choice(msgspec.Struct, frozen=True):
    text: str | None = None
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Chunk(msgspec.Struct, frozen=True):
    choices: list[_Choice] = []
    usage: _Usage | None = None


class _ErrorDetail(msgspec.Struct, frozen=True):
    message: str = ""


class _ErrorBody(msgspec.Struct, frozen=True):
    error: _ErrorDetail | str | None = None
    message: str = ""
    detail: str | list[object] = ""


_chunk_decoder = msgspec.json.Decoder(_Chunk)
_error_decoder = msgspec.json.Decoder(_ErrorBody)


def connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    """Why a connection failed, in a few words."""
    cause = exc.os_error
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve the host name {exc.host!r}"
    if isinstance(cause, TimeoutError):
        return "the connection timed out"
    return cause.strerror or str(cause) or type(cause).__name__


def request_body(engine: Engine, prompt: str, max_tokens: int) -> bytes:
    body: dict[str, object] = {
        "model": engine.model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if engine.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if engine.ignore_eos:
        body["ignore_eos"] = True
    return msgspec.json.encode(body)


async def stream_request(
    session: aiohttp.ClientSession,
    engine: Engine,
    prompt: str,
    max_tokens: int,
    *,
    timeout_s: float,
    on_tokens: Callable[[int], None] = lambda _: None,
) -> RequestOutcome:
    """Raises ``RequestFailed``, or ``TargetUnreachable`` when no connection can be made."""
    sent = time.perf_counter()
    first = last = 0.0
    events = 0
    usage: _Usage | None = None
    ended = False
    try:
        body = request_body(engine, prompt, max_tokens)
        async with await _post(session, engine.generation_url, body, timeout_s) as response:
            if response.status != 200:
                raise RequestFailed(
                    f"HTTP {response.status}: {await _error_text(response)}", response.status
                )
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    ended = True
                    break
                chunk = _chunk_decoder.decode(payload)
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    text = choice.text if choice.delta is None else choice.delta.content
                    if text:
                        last = time.perf_counter()
                        first = first or last
                        events += 1
                        _check_event_count(events, max_tokens)
                        on_tokens(1)
                    ended = ended or choice.finish_reason is not None
    except TimeoutError as exc:
        raise RequestFailed(f"no complete answer within {timeout_s:g} s") from exc
    except aiohttp.ClientConnectorError as exc:
        raise TargetUnreachable(
            f"cannot connect to the engine at {engine.root_url}: {connect_failure(exc)}"
        ) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise RequestFailed(f"the engine broke off the answer ({exc})") from exc
    except aiohttp.ClientError as exc:
        raise RequestFailed(f"{type(exc).__name__}: {exc}") from exc
    except UNREADABLE as exc:
        raise RequestFailed(f"the engine streamed an event that is not JSON: {exc}") from exc
    except ValueError as exc:  # aiohttp's answer to a line longer than its buffer
        raise RequestFailed(f"the engine streamed an unreadable line: {exc}") from exc
    if not ended:
        raise RequestFailed("the stream ended before the answer did (no finish_reason, no [DONE])")
    if events == 0:
        raise RequestFailed("the answer had no output text")
    output_tokens = events
    if usage is not None:
        _check_usage(usage, max_tokens)
    if usage is not None and usage.completion_tokens:
        # Engines may put several tokens in one event; the usage is the true count.
        on_tokens(max(usage.completion_tokens - events, 0))
        output_tokens = usage.completion_tokens
    return RequestOutcome(
        ttft_s=first - sent,
        tpot_s=(last - first) / (output_tokens - 1) if output_tokens > 1 else None,
        e2e_s=last - sent,
        output_tokens=output_tokens,
        prompt_tokens=None if usage is None else usage.prompt_tokens,
    )


def _check_event_count(events: int, max_tokens: int) -> None:
    """Raises ``RequestFailed`` at the first event with text past ``max_tokens``: each
    event holds a token at least, so no answer to ``max_tokens`` has more. Counted, an
    engine streaming without end would add every event to the level's output tokens/s,
    and so to the weight ``--apply`` gives the replica; read on, it would hold the request
    until its timeout."""
    if events > max_tokens:
        raise RequestFailed(
            f"the engine streamed more than {max_tokens} events with text for an answer of at "
            f"most {max_tokens} tokens (max_tokens)"
        )


def _check_usage(usage: _Usage, max_tokens: int) -> None:
    """Raises ``RequestFailed`` for counts no answer to ``max_tokens`` can have: believed, a
    usage of a million tokens for a 16-token answer would count towards the level's output
    tokens/s, and so towards the weight ``--apply`` gives the replica."""
    completion, prompt = usage.completion_tokens, usage.prompt_tokens
    if completion is not None and not 0 <= completion <= max_tokens:
        raise RequestFailed(
            f"the engine's usage counts {completion} output tokens for an answer of at most "
            f"{max_tokens} (max_tokens)"
        )
    if prompt is not None and prompt < 0:
        raise RequestFailed(f"the engine's usage counts {prompt} prompt tokens")


async def _error_text(response: aiohttp.ClientResponse) -> str:
    raw = await response.content.read(ERROR_BODY_BYTES)
    try:
        body = _error_decoder.decode(raw)
    except UNREADABLE:
        return raw.decode(errors="replace").strip() or response.reason or ""
    if isinstance(body.error, _ErrorDetail) and body.error.message:
        return body.error.message
    if isinstance(body.error, str) and body.error:
        return body.error
    return body.message or str(body.detail) or raw.decode(errors="replace")
