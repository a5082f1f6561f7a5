"""Every family an operator scrapes follows the same rules, and the docs list them all.

The pages are written by the collectors ``serve`` and ``gateway`` register (the admin
listener's cluster families, the gateway's own registry), with every family given at least
one series, and read back as Prometheus reads them (``text_string_to_metric_families``).
A family added later is held to the rules without a word here: it is on the page, so it is
judged; its labels are judged once it has a series, which the last test asks for.

The rules: HELP and TYPE on every family; an ``llmgw_`` name; counters, and only
counters, end in ``_total``; units in the name, in base units (``_seconds``, ``_bytes``,
``_ratio`` for a fraction); histogram buckets that rise by at most 5 times a step and, for
the gateway's request times, reach the longest a request can be held; labels only from
``BOUNDED_LABELS``, whose values cannot grow with what clients or nodes send; and the
families and labels docs/operations.md and docs/gateway.md list are those there are.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from app.admin.metrics import LISTENER_FAMILIES, ClusterCollector, LiveFigures
from app.domain.autoscale_policy import MAX_COLD_START_S
from app.domain.events import ModelUnplaceable
from app.gateway.admission import ReplicaView
from app.gateway.ejection import EjectionPolicy, Ejector
from app.gateway.metrics import GatewayMetrics, RoutingReadCounts
from app.listeners.refusals import ListenerCollector, ListenerRefusals, RefusalReason
from app.pki.ends import CertificateEnd, CertificateRole
from tests.unit.test_log_events import ROOT
from tests.unit.test_reconcile import Cluster, of_type

BOUNDED_LABELS = {
    "model": "a declared model (the gateway drops a removed model's series)",
    "replica": "a replica the gateway routes to now (forgotten with its routing table)",
    "phase": "a replica phase",
    "state": "a node's or a gateway's state, from a fixed list",
    "node": "a node the log knows, as its certificate names it (gone once it is forgotten)",
    "type": "an event type",
    "reason": "a reason from the code's own list",
    "policy": "a routing policy",
    "outcome": "how a cold-start hold ended",
    "bound": "head or idle",
    "status": "a status the gateway answers itself, or an engine's status class (2xx..5xx)",
    "certificate": "the role of a certificate the server was given",
    "serial": "a certificate the server was given at its start",
    "quantile": "a fixed list of quantiles",
    "le": "a histogram bucket",
    "listener": "one of the server's own listeners",
    "read": "whole or changes",
}
"""Every label there may be, and why its values are bounded. Never a request id, a key, an
address, or anything else a client or a node names freely."""
NOT_BASE_UNITS = re.compile(
    r"_(ms|us|ns|milliseconds|microseconds|nanoseconds|minutes|hours|days|"
    r"kb|mb|gb|kib|mib|gib|kilobytes|megabytes|bits|percent|pct)(_|$)"
)
HISTOGRAM_UNITS = ("_seconds", "_bytes")
MAX_BUCKET_STEP = 5.0
DOCS = ROOT / "docs"
DOCUMENTED_NAME = re.compile(
    r"^\| `(llmgw_[a-z_]+)`((?:, `_[a-z_]+`)*) \|(?: [a-z]+ \|)? ([^|]*)\|"
)


def cluster_page(recent_pass_durations_s: Sequence[float] = (0.01, 0.02)) -> str:
    """The admin listener's cluster families, of a leader with one model serving, one
    that cannot be placed, an autoscaled demand and a certificate, whose last passes took
    ``recent_pass_durations_s``."""
    cluster = Cluster()
    cluster.node("gpu-1", n_gpus=1)
    cluster.model("llama", replicas=1)
    cluster.after(31)
    cluster.reconcile()
    cluster.serve("llama-1")
    cluster.model("qwen", replicas=1)
    assert of_type(cluster.reconcile(), ModelUnplaceable)
    leader = LiveFigures(
        agents_connected=1,
        reconcile_passes=3,
        recent_pass_durations_s=list(recent_pass_durations_s),
        reconcile_pass_seconds_total=0.05,
        demand={"llama": 2.0},
        gateways_reporting=1,
        earliest_agent_certificate_end=datetime(2027, 1, 1, tzinfo=UTC),
    )
    certificate = CertificateEnd(
        CertificateRole.CA, "0a1b", "llmgw CA", datetime(2030, 1, 1, tzinfo=UTC)
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        ClusterCollector(
            lambda: cluster.state,
            lambda: {"replica_placed": 1},
            lambda: leader,
            lambda: cluster.reports,
            [certificate],
        )
    )
    registry.register(ListenerCollector(LISTENER_FAMILIES, [refused_once("admin")]))
    return generate_latest(registry).decode()


def refused_once(listener: str) -> ListenerRefusals:
    refusals = ListenerRefusals(listener)
    refusals.refused(RefusalReason.CONNECTIONS, 503, None, 1)
    return refusals


def gateway_page() -> str:
    """A gateway's families after one of everything it counts."""
    metrics = GatewayMetrics()
    view = ReplicaView(
        replica_id="llama-1",
        model="llama",
        url="http://127.0.0.1:20001",
        weight=1.0,
        draining=False,
        in_flight=1,
        reserved=0,
        waiting=0.0,
        running=1.0,
        kv_usage=0.5,
        signals_age_s=0.2,
        stale=False,
    )
    metrics.watch_replicas(lambda: [view], lambda: {"llama": 1}, lambda: {("llama", "served"): 1})
    metrics.watch_routes(lambda: {("llama", "least_loaded", "least_loaded"): 1})
    ejector = Ejector(EjectionPolicy(consecutive_failures=1, max_ejected_percent=100))
    ejector.track({"llama": ["llama-1", "llama-2"]})
    ejector.failed("llama-1", ejector.granted("llama-1"), "unreachable")
    metrics.watch_ejections(ejector)
    metrics.answered("llama", 200, duration_s=1.0, added_s=0.01, first_byte_s=0.2, queue_s=0.0)
    metrics.rejected("rpm")
    metrics.retried("unreachable")
    metrics.usage_unusable("llama")
    metrics.engine_timed_out("idle")
    metrics.stream_cut("llama", "broken")
    metrics.egress_refused("outside_engine_networks")
    metrics.egress_refused_routes(1)
    metrics.id_shared()
    metrics.rate_limits_degraded(False)
    metrics.watch_listener_refusals([refused_once("client"), refused_once("metrics")])
    metrics.watch_routing_reads(lambda: RoutingReadCounts(reads=3, whole=1, taking_s=0.02))
    return metrics.render().decode()


PAGES = {"cluster": cluster_page, "gateway": gateway_page}


def families(page: str) -> dict[str, tuple[str, str, set[str], list[Sample]]]:
    """name -> (type, help, labels, samples), read as Prometheus reads the page; a
    counter under its name with ``_total``, as operators query it. The ``_created``
    gauges prometheus_client writes beside counters and histograms are left out."""
    found = {}
    for family in text_string_to_metric_families(page):
        if family.name.endswith("_created") and family.type == "gauge":
            continue
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = {label for sample in family.samples for label in sample.labels}
        found[name] = (family.type, family.documentation, labels, family.samples)
    return found


def offences(page: str) -> list[str]:
    found = []
    helped = set(re.findall(r"^# HELP (\S+) ", page, re.M))
    for name, (kind, documentation, labels, samples) in families(page).items():
        bare = name.removesuffix("_total") if kind == "counter" else name
        if not {bare, name} & helped or not documentation.strip():
            found.append(f"{name}: no HELP")
        if kind == "unknown":
            found.append(f"{name}: no TYPE")
        if not name.startswith("llmgw_"):
            found.append(f"{name}: not an llmgw_ name")
        if kind not in ("counter", "unknown") and name.endswith("_total"):
            found.append(f"{name}: a {kind} named as a counter")
        if kind == "counter" and any(not s.name.endswith(("_total", "_created")) for s in samples):
            found.append(f"{name}: a counter's series without _total")
        if NOT_BASE_UNITS.search(name):
            found.append(f"{name}: not in base units")
        if re.search(r"\b0 to 1\b|\bfraction\b", documentation) and not name.endswith("_ratio"):
            found.append(f"{name}: a fraction not named _ratio")
        for label in sorted(labels - BOUNDED_LABELS.keys()):
            found.append(f"{name}: label {label!r} is not known to be bounded")
        if kind == "histogram":
            found.extend(f"{name}: {problem}" for problem in bucket_problems(name, samples))
    return found


def bucket_problems(name: str, samples: list[Sample]) -> list[str]:
    problems = []
    if not name.endswith(HISTOGRAM_UNITS):
        problems.append(f"a histogram should be in one of {HISTOGRAM_UNITS}")
    bounds = sorted({float(s.labels["le"]) for s in samples if "le" in s.labels})
    finite = [bound for bound in bounds if bound != float("inf")]
    if not samples:
        return problems  # no series yet: its buckets are judged where it has some
    if len(finite) < 8:
        problems.append(f"{len(finite)} buckets: too few to read a quantile from")
    steps = [high / low for low, high in itertools.pairwise(finite) if low > 0]
    if steps and max(steps) > MAX_BUCKET_STEP:
        problems.append(f"a bucket {max(steps):g} times the one below it")
    if name.startswith("llmgw_gateway_") and finite and finite[-1] < MAX_COLD_START_S:
        problems.append(
            f"buckets end at {finite[-1]:g} s, short of the {MAX_COLD_START_S:g} s a "
            "request may be held for a cold start"
        )
    return problems


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_family_follows_the_rules(page: str) -> None:
    assert offences(PAGES[page]()) == []


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_family_has_a_series_so_its_labels_are_judged(page: str) -> None:
    """A family added without a series here (give it one above) would escape the label
    rules and the docs' labels."""
    empty = [name for name, (_, _, _, samples) in families(PAGES[page]()).items() if not samples]
    assert empty == []


def test_reconcile_pass_durations_are_a_summary_whose_quantiles_keep_their_name() -> None:
    """Prometheus' form for quantiles: TYPE summary with ``_sum`` and ``_count``, the
    quantile series under the family's own name, as operators already query them."""
    kind, _, _, samples = families(cluster_page())["llmgw_reconcile_pass_duration_seconds"]

    assert kind == "summary"
    by_series = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}
    name = "llmgw_reconcile_pass_duration_seconds"
    assert by_series == {
        (name, (("quantile", "0.5"),)): 0.02,
        (name, (("quantile", "0.9"),)): 0.02,
        (name, (("quantile", "0.99"),)): 0.02,
        (name, (("quantile", "1"),)): 0.02,
        (f"{name}_count", ()): 3,
        (f"{name}_sum", ()): 0.05,
    }


def test_reconcile_pass_durations_help_stays_the_same_as_passes_fill_its_window() -> None:
    """A HELP that changes between scrapes reads to Prometheus as another family's."""
    help_texts = {
        families(cluster_page(durations))["llmgw_reconcile_pass_duration_seconds"][1]
        for durations in ([], [0.01], [0.01, 0.02], [0.01] * 100)
    }

    assert len(help_texts) == 1, help_texts
    assert "the last 100 passes" in help_texts.pop()


def documented() -> dict[str, set[str]]:
    """Every family the docs' metric tables list, with its labels: gateway.md's and
    operations.md's. ``name`, `_suffix`` rows name several families."""
    listed: dict[str, set[str]] = {}
    for doc in ("gateway.md", "operations.md"):
        for line in (DOCS / doc).read_text().splitlines():
            row = DOCUMENTED_NAME.match(line)
            if row is None:
                continue
            name, more, labels = row.groups()
            stem = name.rsplit("_", 1)[0] if more else name
            if more and name.startswith("llmgw_gateway_replica_"):
                stem = "llmgw_gateway_replica"
            names = [name, *(stem + suffix for suffix in re.findall(r"`(_[a-z_]+)`", more))]
            for each in names:
                listed[each] = set(re.findall(r"`([a-z_]+)`", labels))
    return listed


def published() -> dict[str, set[str]]:
    found = {}
    for make in PAGES.values():
        for name, (kind, _, labels, _) in families(make()).items():
            found[name] = labels - ({"le"} if kind == "histogram" else set())
    return found


def test_the_docs_list_every_family_with_its_labels() -> None:
    assert documented() == published()


NOT_METRICS = {
    "llmgw_append": "the SQL function that appends",
    "llmgw_event_bytes": "the SQL function of an event's canonical bytes",
    "llmgw_next_epoch": "the SQL function of leader epochs",
    "llmgw_runtime": "the runtime role",
    "llmgw_gateway": "the gateway role",
    "llmgw_gateway_replica_kv_usage": "the name before llmgw_gateway_replica_kv_usage_ratio, "
    "in operations.md's upgrade notes",
}
MENTIONED = re.compile(r"`(llmgw_[a-z_]*[a-z])(?![a-z_:])(?:\{([^}`]*)\})?")
"""A metric's name in backquotes, and its selector; not a family of names
(`llmgw_gateway_replica_*`) nor the simulator's own (`llmgw_sim:...`)."""


def mentioned() -> set[tuple[str, str, frozenset[str]]]:
    """(doc, name, labels) of every metric a doc or the README names anywhere, with the
    labels a selector beside it gives (`name{reason="x"}`, `name{model, reason}`)."""
    found = set()
    for doc in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        for name, selector in MENTIONED.findall(doc.read_text()):
            if name in NOT_METRICS:
                continue
            labels = {part.split("=")[0].strip() for part in selector.split(",") if part.strip()}
            found.add((doc.name, name, frozenset(labels)))
    return found


def test_every_metric_the_docs_mention_is_published_with_those_labels() -> None:
    """Beyond the tables: an alert written from a sentence must match a series."""
    families = published()
    wrong = sorted(
        f"{doc}: {name}{{{', '.join(sorted(labels))}}}"
        for doc, name, labels in mentioned()
        if name not in families or not labels <= families[name]
    )
    assert wrong == []


def test_the_rules_catch_what_they_are_for() -> None:
    """Not vacuous: each rule refuses a family that breaks it."""
    page = (
        "# HELP llmgw_request_ms Took.\n# TYPE llmgw_request_ms gauge\nllmgw_request_ms 1.0\n"
        '# TYPE llmgw_hits counter\nllmgw_hits_total{key="k-1"} 1.0\n'
        "# HELP llmgw_cache_usage Used, 0 to 1.\n# TYPE llmgw_cache_usage gauge\n"
        "llmgw_cache_usage 0.5\n"
        "# HELP llmgw_gateway_wait_seconds Waited.\n# TYPE llmgw_gateway_wait_seconds histogram\n"
        + "".join(
            f'llmgw_gateway_wait_seconds_bucket{{le="{le}"}} 0.0\n'
            for le in ("0.1", "1.0", "10.0", "20.0", "30.0", "40.0", "50.0", "60.0", "+Inf")
        )
        + "llmgw_gateway_wait_seconds_count 0.0\nllmgw_gateway_wait_seconds_sum 0.0\n"
    )
    assert offences(page) == [
        "llmgw_request_ms: not in base units",
        "llmgw_hits_total: no HELP",
        "llmgw_hits_total: no TYPE",
        "llmgw_hits_total: label 'key' is not known to be bounded",
        "llmgw_cache_usage: a fraction not named _ratio",
        "llmgw_gateway_wait_seconds: a bucket 10 times the one below it",
        "llmgw_gateway_wait_seconds: buckets end at 60 s, short of the 3600 s a request may "
        "be held for a cold start",
    ]
    assert {"llmgw_gateway_requests_total", "llmgw_leader"} <= documented().keys()
    assert documented()["llmgw_gateway_replica_kv_usage_ratio"] == {"replica", "model"}
    assert ("gateway.md", "llmgw_gateway_engine_timeouts_total", frozenset({"bound"})) in (
        mentioned()
    )
