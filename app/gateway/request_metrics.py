"""The gateway's per-request figures, counted in plain numbers and handed to Prometheus
when ``/metrics`` is scraped.

Every request ends with one counter and up to four histogram updates. prometheus_client's
own ``Counter`` and ``Histogram`` take a lock per update (``MutexValue.inc``) and walk the
buckets in Python; they cost the gateway about 5 % of its CPU per request
(docs/performance.md, "Where llmgw's CPU goes now"). The gateway serves requests on one
thread, its event loop's, and is scraped on that same thread, so nothing here needs a
lock: a request adds to a dictionary entry and to a bucket found by bisection, and the
collector (``RequestCollector``, prometheus_client's documented way to publish figures
kept elsewhere) writes the same series a ``Counter`` and ``Histogram`` would: the same
names, labels, buckets (cumulative, ``+Inf`` last), ``_count``, ``_sum`` and
``_created``.

The counter's ``status`` label is bounded and means one thing per value
(``status_label``): each status the gateway answers itself keeps its number, and any
other an engine sends (a 201, a 418, a 507) is counted under its class, ``2xx`` to
``5xx``, so an engine cannot add a series per status it makes up.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

_bound_label: Callable[[float], str] = floatToGoString
"""A bucket's ``le`` as prometheus_client writes it (``0.005``, ``1.0``, ``+Inf``)."""

GATEWAY_STATUSES = (200, 400, 401, 404, 405, 408, 413, 429, 431, 499, 500, 502, 503, 504)
"""The statuses the gateway answers itself (docs/gateway.md's table of errors; 499: the
client left), each a ``status`` value of its own."""
_OWN_STATUS_LABELS = {status: str(status) for status in GATEWAY_STATUSES}


def status_label(status: int) -> str:
    """The ``status`` label of a request answered with ``status``: its number when the
    gateway answers it itself, else its class (``4xx``), or ``other`` outside 100..599."""
    own = _OWN_STATUS_LABELS.get(status)
    if own is not None:
        return own
    return f"{status // 100}xx" if 100 <= status <= 599 else "other"


class Distribution:
    """One histogram's figures: a count per bucket (not cumulative; the last is ``+Inf``),
    their sum, and when it was created (Prometheus' ``_created``)."""

    __slots__ = ("bounds", "counts", "created", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        # A value on a bucket's bound belongs to that bucket (Prometheus' ``le``).
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


class ModelDistributions:
    """A model's four request histograms."""

    __slots__ = ("added", "duration", "first_byte", "queue")

    def __init__(self, spec: RequestSeries) -> None:
        self.duration = Distribution(spec.duration.bounds)
        self.first_byte = Distribution(spec.first_byte.bounds)
        self.queue = Distribution(spec.queue.bounds)
        self.added = Distribution(spec.added.bounds)


class Series:
    """A published histogram: its name, help and bucket bounds."""

    __slots__ = ("bounds", "documentation", "name")

    def __init__(self, name: str, documentation: str, bounds: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(sorted(bounds))


class RequestSeries:
    """What the request figures are published as."""

    def __init__(
        self,
        requests: tuple[str, str],
        duration: Series,
        first_byte: Series,
        queue: Series,
        added: Series,
    ) -> None:
        self.requests = requests
        """The counter's name (without ``_total``) and help."""
        self.duration = duration
        self.first_byte = first_byte
        self.queue = queue
        self.added = added


class RequestCounts:
    """Requests answered by (model, status) and their histograms by model, as plain
    numbers; single-threaded by design (see the module's docstring)."""

    def __init__(self, spec: RequestSeries) -> None:
        self.spec = spec
        self.answered: dict[tuple[str, str], int] = {}
        """By (model, ``status_label``)."""
        self.created: dict[tuple[str, str], float] = {}
        self.models: dict[str, ModelDistributions] = {}

    def count(self, model: str, status: int) -> None:
        key = (model, status_label(status))
        answered = self.answered
        count = answered.get(key)
        if count is None:
            self.created[key] = time.time()
            answered[key] = 1
        else:
            answered[key] = count + 1

    def keep_models(self, models: Collection[str]) -> None:
        """Forget the figures of every model but ``models`` and ``""`` (requests for no
        declared model)."""
        self.answered = {k: v for k, v in self.answered.items() if _kept(k[0], models)}
        self.created = {k: v for k, v in self.created.items() if _kept(k[0], models)}
        self.models = {m: d for m, d in self.models.items() if _kept(m, models)}

    def of_model(self, model: str) -> ModelDistributions:
        distributions = self.models.get(model)
        if distributions is None:
            distributions = self.models[model] = ModelDistributions(self.spec)
        return distributions


def _kept(model: str, models: Collection[str]) -> bool:
    return not model or model in models


class RequestCollector(Collector):
    """Publishes ``RequestCounts`` at each scrape."""

    def __init__(self, counts: RequestCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        counts, spec = self._counts, self._counts.spec
        name, documentation = spec.requests
        requests = CounterMetricFamily(name, documentation, labels=["model", "status"])
        for (model, status), value in counts.answered.items():
            requests.add_metric([model, status], value, created=counts.created[(model, status)])
        yield requests
        models = list(counts.models.items())
        yield _histogram(spec.duration, [(m, d.duration) for m, d in models])
        yield _histogram(spec.first_byte, [(m, d.first_byte) for m, d in models])
        yield _histogram(spec.queue, [(m, d.queue) for m, d in models])
        yield _histogram(spec.added, [(m, d.added) for m, d in models])


def _histogram(series: Series, children: list[tuple[str, Distribution]]) -> Metric:
    family = HistogramMetricFamily(series.name, series.documentation, labels=["model"])
    bounds = [*(_bound_label(bound) for bound in series.bounds), "+Inf"]
    for model, distribution in children:
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(bounds, distribution.counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        family.add_metric([model], buckets, distribution.total)
        family.samples.append(
            Sample(f"{series.name}_created", {"model": model}, distribution.created)
        )
    return family
