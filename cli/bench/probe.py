"""Before the first level: is the engine there, which model does it serve, does it take
``ignore_eos``, does it answer a request of the run's shape, and how is its prefix cache
reset."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import aiohttp
import msgspec

from cli.bench.errors import TargetRefused, TargetUnreachable
from cli.bench.request import RequestFailed, connect_failure, stream_request
from cli.bench.target import Api, Engine
from cli.client import UNREADABLE
from wire.bounded_body import BodyTooLarge, read_bounded

PROBE_PROMPT = "Say hello."
PROBE_TIMEOUT_S = 60.0
CACHE_RESET_PATHS = ("/reset_prefix_cache", "/flush_cache")
"""vLLM's, then SGLang's."""
MODELS_TIMEOUT_S = 30.0
MAX_MODEL_LIST_BYTES = 1 << 20
"""The most of a ``GET /v1/models`` answer read (an error answer too): an engine lists a
few models, a few hundred bytes each, so a MiB is thousands of them."""


class _ModelCard(msgspec.Struct, frozen=True):
    id: str


class _ModelList(msgspec.Struct, frozen=True):
    data: list[_ModelCard]


async def connect(
    session: aiohttp.ClientSession, root_url: str, model: str | None, api: Api
) -> tuple[Engine, list[str]]:
    """The engine, ready to bench, and notes for the report. Raises ``TargetUnreachable``
    and ``TargetRefused``."""
    served = await served_models(session, root_url)
    engine = Engine(root_url, choose_model(served, model, root_url), api, ignore_eos=True)
    try:
        await stream_request(session, engine, PROBE_PROMPT, 2, timeout_s=PROBE_TIMEOUT_S)
    except RequestFailed as refused:
        if refused.status not in (400, 422):
            raise TargetRefused(
                f"the engine at {root_url} failed a first request: {refused}"
            ) from refused
        engine = replace(engine, ignore_eos=False)
        try:
            await stream_request(session, engine, PROBE_PROMPT, 2, timeout_s=PROBE_TIMEOUT_S)
        except RequestFailed as again:
            raise TargetRefused(
                f"the engine at {root_url} refused a first request for {engine.model}: {again}"
            ) from again
        return engine, [
            f"the engine refused ignore_eos ({refused}): answers may end before "
            "--output-tokens, and throughput counts the tokens they had"
        ]
    return engine, []


async def check_shape(
    session: aiohttp.ClientSession,
    engine: Engine,
    prompt: str,
    output_tokens: int,
    *,
    input_tokens: int,
    timeout_s: float,
) -> None:
    """Sends one request of the run's lengths; raises ``TargetRefused`` quoting the engine
    when it fails. The first probe is a few tokens long, so a prompt longer than the engine's
    context was otherwise found only at the first level, after the plan was printed, and
    every level after it failed the same way."""
    try:
        await stream_request(session, engine, prompt, output_tokens, timeout_s=timeout_s)
    except RequestFailed as refused:
        raise TargetRefused(
            f"the engine at {engine.root_url} failed a request of the run's shape "
            f"(--input-tokens {input_tokens}, --output-tokens {output_tokens}): {refused}; "
            "shorten them to fit the engine's context, or raise --request-timeout if it "
            "needs longer"
        ) from refused


def _wants_credentials(status: int) -> str:
    """What to do instead when the server asks for credentials: a gateway's client URL
    (llmgw's or another) answers 401 to a request without an API key, and bench, which
    measures one engine and not a gateway's admission, sends none."""
    if status not in (401, 403):
        return ""
    return (
        "; bench sends no API key: it measures one engine directly, not through a gateway, "
        "so give the engine's own address (--url http://NODE:PORT) or --replica ID"
    )


async def served_models(session: aiohttp.ClientSession, root_url: str) -> list[str] | None:
    """The models ``GET /v1/models`` lists; ``None`` when the engine has no such route."""
    url = f"{root_url}/v1/models"
    try:
        async with session.get(
            url, timeout=aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S)
        ) as response:
            if response.status == 404:
                return None
            try:
                body = await read_bounded(
                    response.content_length, response.content.iter_any(), MAX_MODEL_LIST_BYTES
                )
            except BodyTooLarge as exc:
                response.close()
                raise TargetRefused(
                    f"GET {url} {exc}, the most bench reads of a model list: this is not an "
                    "OpenAI-compatible engine (or not its root URL), or it is broken"
                ) from exc
            if response.status != 200:
                raise TargetRefused(
                    f"GET {url} answered HTTP {response.status}: "
                    f"{body[:300].decode(errors='replace')}{_wants_credentials(response.status)}"
                )
    except aiohttp.ClientConnectorError as exc:
        raise TargetUnreachable(
            f"cannot reach the engine at {root_url}: {connect_failure(exc)} "
            "(is it running, and are the host and port right?)"
        ) from exc
    except TimeoutError as exc:
        raise TargetUnreachable(
            f"the engine at {root_url} sent no whole answer to GET /v1/models within "
            f"{MODELS_TIMEOUT_S:g} s"
        ) from exc
    except aiohttp.ClientError as exc:
        raise TargetUnreachable(
            f"the engine at {root_url} did not answer GET /v1/models: "
            f"{str(exc) or type(exc).__name__}"
        ) from exc
    try:
        return [card.id for card in msgspec.json.decode(body, type=_ModelList).data]
    except UNREADABLE as exc:
        raise TargetRefused(
            f"GET {url} did not answer an OpenAI model list, so this is not an OpenAI-compatible "
            f"engine (or not its root URL): {exc}"
        ) from exc


def choose_model(served: Sequence[str] | None, wanted: str | None, root_url: str) -> str:
    if served is None:
        if wanted is None:
            raise TargetRefused(
                f"the engine at {root_url} does not list its models (no GET /v1/models): "
                "name the model with --model"
            )
        return wanted
    if wanted is not None:
        if wanted not in served:
            raise TargetRefused(
                f"the engine at {root_url} serves {_listed(served)}, not {wanted!r}"
            )
        return wanted
    if len(served) != 1:
        raise TargetRefused(
            f"the engine at {root_url} serves {_listed(served)}: choose one with --model"
        )
    return served[0]


def _listed(models: Sequence[str]) -> str:
    return ", ".join(repr(model) for model in models) if models else "no model"


class PrefixCacheReset:
    """Empties the engine's prefix cache between levels, by the first route it offers."""

    def __init__(self, session: aiohttp.ClientSession, root_url: str) -> None:
        self._session = session
        self._root_url = root_url
        self._candidates: Sequence[str] = CACHE_RESET_PATHS
        self.path: str | None = None
        """The route that worked; ``None`` until one did, or when none exists."""

    async def __call__(self) -> bool:
        for path in self._candidates:
            try:
                async with self._session.post(
                    f"{self._root_url}{path}", timeout=aiohttp.ClientTimeout(total=30)
                ) as response:
                    succeeded = response.status < 300
            except (aiohttp.ClientError, TimeoutError):
                succeeded = False
            if succeeded:
                self.path = path
                self._candidates = (path,)
                return True
        if self.path is None:
            self._candidates = ()
        return False
