"""Reads the engine's ``/metrics``: once before and after a level (counters), and every
sample interval while the level measures (queue depth, KV-cache usage)."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from cli.bench.errors import BenchError, MetricsUnavailable, TargetUnreachable
from cli.bench.load import ClosedLoop, Phase
from cli.bench.metrics import EngineReading, missing_gauges, read_metrics
from cli.bench.request import connect_failure
from cli.bench.target import Engine
from wire.bounded_body import BodyTooLarge
from wire.engines import PROFILES
from wire.metrics_page import read_metrics_page

SCRAPE_TIMEOUT_S = 10.0
"""A scrape's time, head and page; its size is ``wire.metrics_page``'s bound."""
METRICS_FLAGS = ", ".join(
    f"{profile.name}: {profile.metrics_flag or 'on by default'}"
    for profile in PROFILES.values()
    if profile.name != "openai"
)
"""How each engine is told to serve ``/metrics`` (``wire.engines``)."""


class MetricsReader:
    def __init__(self, session: aiohttp.ClientSession, engine: Engine) -> None:
        self._session = session
        self._engine = engine

    async def read(self) -> EngineReading:
        """Raises ``MetricsUnavailable`` and ``TargetUnreachable``."""
        url = self._engine.metrics_url
        try:
            async with self._session.get(
                url, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
            ) as response:
                status = response.status
                page = await read_metrics_page(response.content_length, response.content.iter_any())
        except aiohttp.ClientConnectorError as exc:
            raise TargetUnreachable(
                f"cannot connect to the engine at {self._engine.root_url} to read {url}: "
                f"{connect_failure(exc)}"
            ) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise TargetUnreachable(
                f"the engine at {self._engine.root_url} broke off the connection while {url} "
                f"was read: {str(exc) or type(exc).__name__}"
            ) from exc
        except TimeoutError as exc:
            raise MetricsUnavailable(
                f"GET {url} did not finish within {SCRAPE_TIMEOUT_S:g} s"
            ) from exc
        except aiohttp.ClientError as exc:
            raise MetricsUnavailable(f"GET {url} failed: {str(exc) or type(exc).__name__}") from exc
        except BodyTooLarge as exc:
            raise MetricsUnavailable(f"GET {url} {exc}: bench reads no more of it") from exc
        if status != 200:
            raise MetricsUnavailable(
                f"GET {url} answered HTTP {status}: bench reads the engine's waiting queue and "
                "KV-cache usage there to recommend target_waiting and kv_ceiling; start the "
                f"engine with its Prometheus metrics on ({METRICS_FLAGS})"
            )
        return read_metrics(page.decode(errors="replace"), self._engine.model)

    async def check(self) -> EngineReading:
        """A first reading, refused when it lacks the gauges bench needs."""
        reading = await self.read()
        missing = missing_gauges(reading)
        if missing:
            raise MetricsUnavailable(
                f"{self._engine.metrics_url} has no sample of {' nor '.join(missing)}: bench "
                "needs it to recommend target_waiting"
            )
        return reading


async def sample_while_measuring(
    reader: MetricsReader, load: ClosedLoop, interval_s: float, samples: list[EngineReading]
) -> None:
    """Append a reading every ``interval_s`` while ``load`` measures; runs until cancelled.
    A failed scrape is skipped: the load notices an engine that went away."""
    while True:
        if load.phase is Phase.MEASURE:
            with contextlib.suppress(BenchError):
                samples.append(await reader.read())
        await asyncio.sleep(interval_s)
