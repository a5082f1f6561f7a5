"""Engine signals: reading an engine's Prometheus ``/metrics``, and a scraper per replica.

Metric names differ by engine and come from the engine profiles (``wire.engines``); the
gateway looks for every profile's names, in profile order, and the first name found wins,
each summed over every series (an engine with several ``engine`` label values reports them
all), but for the KV usage (below):

- vLLM: waiting ``vllm:num_requests_waiting``, running ``vllm:num_requests_running``, KV
  ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` in older releases);
- SGLang: ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage``;
- llama.cpp: ``llamacpp:requests_deferred``, ``llamacpp:requests_processing``, and no KV
  gauge in current builds (``llamacpp:kv_cache_usage_ratio`` in older ones).

The KV usage is a fraction of one engine's cache, so of several series the fullest one's
is taken, not their sum: two data-parallel engines each 45 % full are not 90 % full, and
``kv_ceiling`` (which ``llmgw-cli bench`` sets from the fullest engine's usage too,
``cli.bench.metrics``) would refuse the replica at half its cache.

Routes do not say which engine serves them, and an ``openai`` engine may be any of these:
so the names, not the spec, say which engine answers.

An engine that exposes no waiting and no KV name gives no reading: the router treats it as
stale, i.e. routes to it by its own in-flight count. One that lacks only some signals is
admitted by those it has (a missing one reads 0: llama.cpp is admitted by its waiting
queue alone), and its scraper says once which are absent.

A page is the engine's word, read as hostile input: a scrape ends within its timeout (head,
page and all), and a page over ``MAX_PAGE_BYTES`` is a failed scrape, refused as soon as its
declared length or what came of it says so, never read whole.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from operator import add

import aiohttp
import msgspec
import structlog

from wire.bounded_body import BodyTooLarge
from wire.engines import signal_names
from wire.metrics_page import MAX_METRICS_PAGE_BYTES, read_metrics_page

log = structlog.get_logger("llmgw.gateway")

MAX_PAGE_BYTES = MAX_METRICS_PAGE_BYTES
"""The most of a ``/metrics`` page a scrape reads (``wire.metrics_page``, shared with
``llmgw-cli bench``); the page is read four times a second."""

MAX_READING = 1e9
"""The largest figure a reading holds: a larger one (``+Inf``, or samples whose sum
overflows) reads as this. It is still full, far above any ``target_waiting`` and any KV
usage, and it stays finite: the bound of the ``prefix`` and ``session`` policies adds the
replicas' counts up and rounds its shares to whole requests, which an infinite count made
raise for every keyed request of the model (``app.domain.rendezvous``)."""

WAITING_NAMES = signal_names("waiting")
RUNNING_NAMES = signal_names("running")
KV_NAMES = signal_names("kv_usage")
SIGNAL_NAMES = frozenset(WAITING_NAMES + RUNNING_NAMES + KV_NAMES)
ADMITTED_BY = {
    frozenset(): "waiting queue and KV-cache usage",
    frozenset({"running"}): "waiting queue and KV-cache usage",
    frozenset({"kv_usage"}): "waiting queue only",
    frozenset({"kv_usage", "running"}): "waiting queue only",
    frozenset({"waiting"}): "KV-cache usage only",
    frozenset({"waiting", "running"}): "KV-cache usage only",
}
"""What admission uses, by the signals an engine lacks (it needs waiting or KV usage)."""


class EngineReading(msgspec.Struct, frozen=True, kw_only=True):
    waiting: float
    running: float
    kv_usage: float
    names: tuple[str, ...]
    """The metric names the reading came from."""
    absent: tuple[str, ...] = ()
    """The signals (``waiting``, ``running``, ``kv_usage``) the engine exports no name for:
    they read 0, and admission goes by the others."""


def sum_samples(
    text: str, names: frozenset[str], highest: frozenset[str] = frozenset()
) -> dict[str, float]:
    """Samples of the metrics in ``names`` from Prometheus text, summed over their series;
    of those also in ``highest``, the highest of their series instead.

    Lines that cannot be read, and values no gauge of these can hold (NaN, negative), are
    skipped: one odd line must not hide the others.
    """
    totals: dict[str, float] = {}
    # A vLLM page has thousands of histogram lines: look for the wanted lines only, with
    # str.find, rather than walking every line in Python. Lines end with "\n" only.
    page = "\n" + text
    for name in names:
        needle = "\n" + name
        combine = max if name in highest else add
        start = page.find(needle)
        while start != -1:
            end = page.find("\n", start + 1)
            parsed = _parse_sample(page[start + 1 : end if end != -1 else None].rstrip("\r"))
            if parsed is not None and parsed[0] == name and _a_gauge_reading(parsed[1]):
                totals[name] = combine(totals.get(name, 0.0), parsed[1])
            start = -1 if end == -1 else page.find(needle, end)
    return totals


def _a_gauge_reading(value: float) -> bool:
    """Whether ``value`` can be a queue length or a usage: a number not below 0. An engine
    whose page says -1e9 waiting (or -inf KV usage) would look idler than idle and draw
    its model's traffic; such a sample is skipped like a line that cannot be read. +Inf
    stays: it reads as full, which draws nothing (``read_engine_signals`` keeps it finite)."""
    return value >= 0.0  # False for NaN too


def _parse_sample(line: str) -> tuple[str, float] | None:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        # Only the value and a timestamp follow the label set, so its closing brace is the
        # last one on the line, whatever braces the label values hold.
        end = line.rfind("}")
        if end < brace:
            return None
        rest = line[end + 1 :].split()
    else:
        name, *rest = line.split()
    if not rest:
        return None
    try:
        return name, float(rest[0])
    except ValueError:
        return None


def read_engine_signals(text: str) -> EngineReading | None:
    """The engine's reading; each figure at most ``MAX_READING``, however large its page
    says it is."""
    totals = {
        name: total if total <= MAX_READING else MAX_READING
        for name, total in sum_samples(text, SIGNAL_NAMES, frozenset(KV_NAMES)).items()
    }
    waiting_name = _first_present(WAITING_NAMES, totals)
    kv_name = _first_present(KV_NAMES, totals)
    if waiting_name is None and kv_name is None:
        return None
    running_name = _first_present(RUNNING_NAMES, totals)
    found = {"waiting": waiting_name, "running": running_name, "kv_usage": kv_name}
    return EngineReading(
        waiting=totals[waiting_name] if waiting_name else 0.0,
        running=totals[running_name] if running_name else 0.0,
        kv_usage=totals[kv_name] if kv_name else 0.0,
        names=tuple(name for name in found.values() if name is not None),
        absent=tuple(signal for signal, name in found.items() if name is None),
    )


def _first_present(candidates: tuple[str, ...], totals: dict[str, float]) -> str | None:
    return next((name for name in candidates if name in totals), None)


class ScrapeFailed(Exception):
    """One scrape gave no reading (its cause is in the message)."""


class MetricsScraper:
    """Scrapes one replica's ``/metrics`` every ``interval_s`` until cancelled.

    ``begin()`` is called as each scrape is sent and returns its sequence number;
    ``report(sequence, reading)`` when it ends, with ``None`` for a failure.
    """

    def __init__(
        self,
        *,
        replica_id: str,
        url: str,
        session: aiohttp.ClientSession,
        interval_s: float,
        timeout_s: float,
        begin: Callable[[], int],
        report: Callable[[int, EngineReading | None], None],
    ) -> None:
        self.replica_id = replica_id
        self.url = url
        self._session = session
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._begin = begin
        self._report = report
        self._names_logged = False
        self._failing = False

    async def run(self) -> None:
        # Every line the scraper logs names its replica.
        with structlog.contextvars.bound_contextvars(replica_id=self.replica_id):
            await self._scrape_for_ever()

    async def _scrape_for_ever(self) -> None:
        while True:
            sequence = self._begin()
            try:
                reading = await self.scrape_once()
            except ScrapeFailed as exc:
                self._note_failure(str(exc))
                self._report_or_log(sequence, None)
            except Exception:
                # A bug here must not end the scraper: its replica would stay stale for ever.
                log.exception("engine_metrics_scrape_crashed")
                self._failing = True
                self._report_or_log(sequence, None)
            else:
                self._note_success(reading)
                self._report_or_log(sequence, reading)
            await asyncio.sleep(self._interval_s)

    def _report_or_log(self, sequence: int, reading: EngineReading | None) -> None:
        """Hand the reading on. The router serves its waiters there, and a bug of its must
        not end the scraper either: the replica would stay stale for ever."""
        try:
            self._report(sequence, reading)
        except Exception:
            log.exception("engine_metrics_report_crashed")

    async def scrape_once(self) -> EngineReading:
        try:
            async with self._session.get(f"{self.url}/metrics", timeout=self._timeout) as resp:
                if resp.status != 200:
                    raise ScrapeFailed(f"GET /metrics answered {resp.status}")
                page = await _read_page(resp)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ScrapeFailed(f"{type(exc).__name__}: {exc}") from exc
        # Prometheus' text format is UTF-8.
        reading = read_engine_signals(page.decode(errors="replace"))
        if reading is None:
            raise ScrapeFailed("no known waiting-queue or KV-cache metric")
        return reading

    def _note_failure(self, error: str) -> None:
        if not self._failing:
            log.warning("engine_metrics_unavailable", error=error)
            self._failing = True

    def _note_success(self, reading: EngineReading) -> None:
        if self._failing:
            log.info("engine_metrics_back")
            self._failing = False
        if not self._names_logged:
            log.info("engine_metrics_found", names=list(reading.names))
            if reading.absent:
                log.info(
                    "engine_signals_absent",
                    absent=list(reading.absent),
                    admission_by=ADMITTED_BY[frozenset(reading.absent)],
                )
            self._names_logged = True


async def _read_page(resp: aiohttp.ClientResponse) -> bytes:
    """The page, up to ``MAX_PAGE_BYTES``; ``ScrapeFailed`` (the connection closed) past it."""
    try:
        return await read_metrics_page(resp.content_length, resp.content.iter_any())
    except BodyTooLarge as exc:
        resp.close()
        raise ScrapeFailed(f"GET /metrics {exc}") from exc


class ScraperTasks:
    """One scraper task per replica id, started and stopped as routes come and go."""

    def __init__(self, *, interval_s: float, timeout_s: float) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("scrape interval and timeout must be positive")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def __contains__(self, replica_id: str) -> bool:
        return replica_id in self._tasks

    def start(
        self,
        replica_id: str,
        url: str,
        session: aiohttp.ClientSession,
        begin: Callable[[], int],
        report: Callable[[int, EngineReading | None], None],
    ) -> None:
        self.stop(replica_id)
        scraper = MetricsScraper(
            replica_id=replica_id,
            url=url,
            session=session,
            interval_s=self.interval_s,
            timeout_s=self.timeout_s,
            begin=begin,
            report=report,
        )
        self._tasks[replica_id] = asyncio.get_running_loop().create_task(
            scraper.run(), name=f"scrape {replica_id}"
        )

    def stop(self, replica_id: str) -> None:
        task = self._tasks.pop(replica_id, None)
        if task is not None:
            task.cancel()
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def close(self) -> None:
        for replica_id in list(self._tasks):
            self.stop(replica_id)
        for task in list(self._stopping):
            with contextlib.suppress(asyncio.CancelledError):
                await task
