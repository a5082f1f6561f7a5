"""Client traffic through a gateway, as applications send it: ``openai.AsyncOpenAI`` clients,
each sending one request after another (chat and text completions, streamed and not, in
turn) until stopped, with the SDK's own retries off so that every failure is seen.

Every request's outcome is kept: ok, or the kind of failure (an HTTP status, a stream
that broke or ended without a finish reason, a connection error, a timeout), when it
started and how long it took.

    async with Traffic(gateway.url, key, "sim", clients=20) as traffic:
        await traffic.wait_for_successes(50)
        ...  # the fault under test
        await traffic.wait_for_successes(50)
    traffic.assert_no_failures()
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

import httpx
import openai

from tests.support.waiting import wait_until

CALLS = ("chat", "chat-stream", "completion", "completion-stream")
OK = "ok"
STOP_WITHIN_S = 30.0
RETRY_AFTER_CAP_S = 5.0
"""A client told to come back later waits at most this long, whatever the header says."""


@dataclass(frozen=True)
class Outcome:
    """One request: ``kind`` is ``ok`` or what went wrong."""

    client: int
    call: str
    started_at: float
    """``time.monotonic()`` when the request was sent."""
    latency_s: float
    kind: str = OK
    detail: str = ""
    retry_after: str | None = None
    """The ``Retry-After`` header of a 429."""

    @property
    def ok(self) -> bool:
        return self.kind == OK

    @property
    def backpressure(self) -> bool:
        """A 429 that told the client when to come back: the gateway shedding load."""
        return self.kind == "status 429" and self.retry_after is not None


class UnfinishedAnswer(Exception):
    """An answer without text or without a finish reason."""


class BrokenStream(Exception):
    """A stream whose connection failed after its answer had started."""


@dataclass(eq=False)
class Traffic:
    """``clients`` concurrent clients of ``model`` at ``base_url`` until ``stop()``.

    With ``rate_per_s`` the clients together send about that many requests a second (each
    keeps its own schedule), else each sends its next request as soon as the last ended.
    A 429 that carries ``Retry-After`` makes that client wait as told (capped) before its
    next request when ``honour_retry_after`` is set; it is still recorded."""

    base_url: str
    api_key: str
    model: str
    clients: int = 20
    max_tokens: int = 8
    rate_per_s: float | None = None
    honour_retry_after: bool = False
    request_timeout_s: float = 30.0
    outcomes: list[Outcome] = field(default_factory=list, init=False)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    _sdk: openai.AsyncOpenAI | None = field(default=None, init=False)

    async def __aenter__(self) -> Traffic:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    def start(self) -> None:
        if self._tasks:
            raise AssertionError("traffic already started")
        self._sdk = openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=self.api_key,
            max_retries=0,
            timeout=self.request_timeout_s,
        )
        self._tasks = [
            asyncio.create_task(self._client(index), name=f"traffic-client-{index}")
            for index in range(self.clients)
        ]

    async def stop(self) -> None:
        """Let every client finish the request it is in, then stop them."""
        self._stopping.set()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=STOP_WITHIN_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sdk is not None:
            await self._sdk.close()

    # -- what happened ------------------------------------------------------------------

    def successes(self) -> int:
        return sum(outcome.ok for outcome in self.outcomes)

    def failures(self, *, tolerate_backpressure: bool = False) -> list[Outcome]:
        return [
            o for o in self.outcomes if not o.ok and not (tolerate_backpressure and o.backpressure)
        ]

    async def wait_for_successes(self, count: int, *, within_s: float = 20.0) -> None:
        """Until ``count`` more requests than now have succeeded."""
        wanted = self.successes() + count
        try:
            await wait_until(
                lambda: self._running() and self.successes() >= wanted,
                within_s=within_s,
                every_s=0.05,
                what=f"{count} more successful requests",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; so far {self.summary()}") from exc

    def summary(self) -> str:
        """Counts by outcome kind, and the first few failures with their details."""
        kinds = Counter(o.kind for o in self.outcomes)
        counts = ", ".join(f"{kind}: {n}" for kind, n in kinds.most_common())
        failed = [o for o in self.outcomes if not o.ok][:10]
        lines = [f"{len(self.outcomes)} requests ({counts or 'none'})"]
        lines += [
            f"  client {o.client} {o.call} at +{o.started_at - self._first():.2f}s after "
            f"{o.latency_s:.2f}s: {o.kind} {o.detail}".rstrip()
            for o in failed
        ]
        return "\n".join(lines)

    def assert_no_failures(self, *, tolerate_backpressure: bool = False) -> None:
        """Every request succeeded (429s with ``Retry-After`` aside, when tolerated), and
        some were sent at all."""
        assert self.successes() > 0, self.summary()
        assert not self.failures(tolerate_backpressure=tolerate_backpressure), self.summary()

    def _first(self) -> float:
        return min((o.started_at for o in self.outcomes), default=0.0)

    def _running(self) -> bool:
        crashed = [t for t in self._tasks if t.done() and not t.cancelled() and t.exception()]
        if crashed:
            raise AssertionError(f"a traffic client crashed: {crashed[0].exception()!r}")
        return True

    # -- the clients --------------------------------------------------------------------

    async def _client(self, index: int) -> None:
        sent = 0
        next_at = time.monotonic() + self._interval() * index / self.clients
        while not self._stopping.is_set():
            if self.rate_per_s is not None:
                await self._pause(next_at - time.monotonic())
                next_at = max(next_at + self._interval(), time.monotonic())
                if self._stopping.is_set():
                    return
            outcome = await self._request(index, CALLS[(index + sent) % len(CALLS)])
            self.outcomes.append(outcome)
            sent += 1
            if outcome.backpressure and self.honour_retry_after:
                await self._pause(_seconds(outcome.retry_after))

    def _interval(self) -> float:
        return 0.0 if self.rate_per_s is None else self.clients / self.rate_per_s

    async def _pause(self, seconds: float) -> None:
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    async def _request(self, client: int, call: str) -> Outcome:
        started = time.monotonic()

        def outcome(kind: str = OK, detail: str = "", retry_after: str | None = None) -> Outcome:
            latency = time.monotonic() - started
            return Outcome(client, call, started, latency, kind, detail, retry_after)

        try:
            await self._send(call, client)
        except openai.APIStatusError as exc:
            retry_after = exc.response.headers.get("retry-after")
            return outcome(f"status {exc.status_code}", _message(exc), retry_after)
        except openai.APITimeoutError as exc:
            return outcome("timeout", _message(exc))
        except openai.APIConnectionError as exc:
            return outcome("connection error", _message(exc))
        except openai.APIError as exc:
            return outcome("stream error event", _message(exc))
        except BrokenStream as exc:
            return outcome("broken stream", _message(exc.__cause__ or exc))
        except UnfinishedAnswer as exc:
            return outcome("unfinished answer", str(exc))
        except Exception as exc:  # whatever else broke is a failure to count, not a crash
            return outcome(type(exc).__name__, str(exc))
        return outcome()

    async def _send(self, call: str, client: int) -> None:
        sdk = self._sdk
        assert sdk is not None
        words = f"client {client} asks something {time.monotonic_ns()}"
        if call == "chat":
            chat = await sdk.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": words}],
                max_tokens=self.max_tokens,
            )
            _check_finished(chat.choices[0].message.content, chat.choices[0].finish_reason)
        elif call == "chat-stream":
            chat_chunks = await sdk.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": words}],
                max_tokens=self.max_tokens,
                stream=True,
            )
            text, finish = [], None
            try:
                async for chunk in chat_chunks:
                    for choice in chunk.choices:
                        text.append(choice.delta.content or "")
                        finish = choice.finish_reason or finish
            except openai.APIConnectionError as exc:
                raise BrokenStream from exc
            _check_finished("".join(text), finish)
        elif call == "completion":
            completion = await sdk.completions.create(
                model=self.model, prompt=words, max_tokens=self.max_tokens
            )
            _check_finished(completion.choices[0].text, completion.choices[0].finish_reason)
        else:
            completion_chunks = await sdk.completions.create(
                model=self.model, prompt=words, max_tokens=self.max_tokens, stream=True
            )
            pieces: list[str] = []
            ended: str | None = None
            try:
                async for piece in completion_chunks:
                    for part in piece.choices:
                        pieces.append(part.text)
                        # Typed as always set, but null on every chunk but the last.
                        reason: str | None = part.finish_reason
                        ended = reason or ended
            except openai.APIConnectionError as exc:
                raise BrokenStream from exc
            _check_finished("".join(pieces), ended)


async def serves(base_url: str, api_key: str, model: str) -> bool:
    """Whether a chat completion of ``model`` through the gateway at ``base_url`` succeeds
    now: before traffic starts, wait on this until the gateway has a serving replica and
    the key."""
    body = {"model": model, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1}
    async with httpx.AsyncClient(timeout=10.0) as http:
        with contextlib.suppress(httpx.TransportError):
            answer = await http.post(
                f"{base_url}/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {api_key}"},
            )
            return answer.status_code == 200
    return False


async def knows_key(base_url: str, api_key: str) -> bool:
    """Whether the gateway at ``base_url`` takes ``api_key`` now (its ``/models`` answers
    200): for a test that must not send a completion before its first one counts."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        with contextlib.suppress(httpx.TransportError):
            answer = await http.get(
                f"{base_url}/models", headers={"authorization": f"Bearer {api_key}"}
            )
            return answer.status_code == 200
    return False


def _check_finished(text: str | None, finish_reason: str | None) -> None:
    if not text:
        raise UnfinishedAnswer("no text in the answer")
    if finish_reason is None:
        raise UnfinishedAnswer("the answer ended without a finish reason")


def _message(exc: BaseException) -> str:
    cause = exc.__cause__
    return f"{exc}" + (f" ({type(cause).__name__}: {cause})" if cause else "")


def _seconds(retry_after: str | None) -> float:
    try:
        return min(float(retry_after or 0), RETRY_AFTER_CAP_S)
    except ValueError:
        return 1.0


def count_by_kind(outcomes: Sequence[Outcome]) -> Counter[str]:
    return Counter(outcome.kind for outcome in outcomes)
