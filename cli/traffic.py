"""The ``traffic`` sections of ``llmgw-cli replica`` and ``llmgw-cli model``: what the
gateways measured of a replica's requests over their window, or of a model's replicas per
revision (docs/gateway.md#what-the-gateway-measures)."""

from __future__ import annotations

from rich.console import Console

from cli.operator import print_facts
from cli.render import styled, text
from cli.views import ReplicaTrafficView


def traffic_title(traffic: ReplicaTrafficView) -> str:
    gateways = "1 gateway" if traffic.gateways == 1 else f"{traffic.gateways} gateways"
    return f"traffic (last {traffic.window_s:g} s, {gateways})"


def partial_text(traffic: ReplicaTrafficView, what: str) -> str | None:
    """``1 gateway's report may have left it out``, where the figures may lack requests:
    a report lists at most 2,000 replicas, the busiest (docs/gateway.md); None when every
    gateway's report holds all of ``what``."""
    if traffic.unlisted <= 0:
        return None
    reports = (
        "1 gateway's report" if traffic.unlisted == 1 else f"{traffic.unlisted:,} gateways' reports"
    )
    return f"{reports} may have left {what} out"


def traffic_facts(traffic: ReplicaTrafficView) -> list[tuple[str, str | None]]:
    """``name: value`` lines, each well within 80 columns; ``partial`` first, when some
    gateway's report may have left the replica out."""
    failed = f"{traffic.errors:,}"
    if traffic.error_rate is not None:
        failed += f" ({percent(traffic.error_rate)})"
    partial = partial_text(traffic, "it")
    return [
        *([("partial", partial)] if partial else []),
        ("requests", f"{traffic.requests:,}"),
        ("failed", failed),
        ("cancelled", f"{traffic.cancelled:,} by their clients (not counted above)"),
        ("abandoned", f"{traffic.abandoned:,} of those before any of the answer came"),
        ("TTFT p95", latency(traffic.ttft_p95_ms, traffic.ttft_samples, "stream")),
        ("TPOT p95", latency(traffic.tpot_p95_ms, traffic.tpot_samples, "stream")),
        ("latency p95", latency(traffic.latency_p95_ms, traffic.latency_samples, "answer")),
    ]


def print_traffic(traffic: ReplicaTrafficView | None, console: Console) -> None:
    if traffic is None:
        console.print(styled(("traffic:", "bold"), " no gateway reports in the last 5 s"))
        return
    console.print(text(f"{traffic_title(traffic)}:", "bold"))
    print_facts([(f"  {name}", value) for name, value in traffic_facts(traffic)], console)


def print_traffic_by_revision(by_revision: dict[str, ReplicaTrafficView], console: Console) -> None:
    if not by_revision:
        none = " none (no gateway reports in the last 5 s, or no replica)"
        console.print(styled(("traffic:", "bold"), none))
        return
    first = next(iter(by_revision.values()))
    title = traffic_title(first).replace("traffic (", "traffic by revision (", 1)
    console.print(text(f"{title}:", "bold"))
    for revision, traffic in sorted(by_revision.items(), key=lambda item: -int(item[0])):
        for line in revision_lines(revision, traffic):
            console.print(text(f"  {line}"))


def revision_lines(revision: str, traffic: ReplicaTrafficView) -> list[str]:
    """``revision_line``, and under it, where some gateway's report may have left replicas
    of the revision out, ``  partial: 1 gateway's report may have left replicas of it
    out``: a revision's figures may then lack requests."""
    partial = partial_text(traffic, "replicas of it")
    return [revision_line(revision, traffic), *([f"  partial: {partial}"] if partial else [])]


def revision_line(revision: str, traffic: ReplicaTrafficView) -> str:
    """``rev 2: 1,204 requests, 1.0 % failed, TTFT p95 182 ms, TPOT p95 21 ms``: the
    figures a canary is judged by, newest revision first; the latency of whole answers
    stands in for TTFT where nothing was streamed."""
    parts = [f"{traffic.requests:,} request" + ("" if traffic.requests == 1 else "s")]
    if traffic.error_rate is not None:
        parts.append(f"{percent(traffic.error_rate)} failed")
    if traffic.ttft_p95_ms is not None:
        parts.append(f"TTFT p95 {milliseconds(traffic.ttft_p95_ms)}")
    elif traffic.latency_p95_ms is not None:
        parts.append(f"latency p95 {milliseconds(traffic.latency_p95_ms)}")
    if traffic.tpot_p95_ms is not None:
        parts.append(f"TPOT p95 {milliseconds(traffic.tpot_p95_ms)}")
    return f"rev {revision}: " + ", ".join(parts)


def percent(rate: float) -> str:
    return f"{rate * 100:.1f} %" if rate else "0 %"


def latency(ms: float | None, samples: int, what: str) -> str:
    if ms is None:
        return f"- (no {what}s)"
    counted = f"{samples:,} {what}" + ("" if samples == 1 else "s")
    return f"{milliseconds(ms)} ({counted})"


def milliseconds(ms: float) -> str:
    """Three significant figures at most: the figures are within 4.4 % anyway."""
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    if ms >= 10:
        return f"{ms:.0f} ms"
    return f"{ms:.2g} ms"
