"""The ``traffic`` section of ``llmgw-cli replica``: what the gateways measured of the
replica's requests over their window (docs/gateway.md#what-the-gateway-measures)."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from cli.operator import print_facts
from cli.views import ReplicaTrafficView


def traffic_title(traffic: ReplicaTrafficView) -> str:
    gateways = "1 gateway" if traffic.gateways == 1 else f"{traffic.gateways} gateways"
    return f"traffic (last {traffic.window_s:g} s, {gateways})"


def traffic_facts(traffic: ReplicaTrafficView) -> list[tuple[str, str | None]]:
    """``name: value`` lines, each well within 80 columns."""
    failed = f"{traffic.errors:,}"
    if traffic.error_rate is not None:
        failed += f" ({percent(traffic.error_rate)})"
    return [
        ("requests", f"{traffic.requests:,}"),
        ("failed", failed),
        ("cancelled", f"{traffic.cancelled:,} by their clients (not counted above)"),
        ("TTFT p95", latency(traffic.ttft_p95_ms, traffic.ttft_samples, "stream")),
        ("TPOT p95", latency(traffic.tpot_p95_ms, traffic.tpot_samples, "stream")),
        ("latency p95", latency(traffic.latency_p95_ms, traffic.latency_samples, "answer")),
    ]


def print_traffic(traffic: ReplicaTrafficView | None, console: Console) -> None:
    if traffic is None:
        console.print(Text.assemble(("traffic:", "bold"), " no gateway reports in the last 5 s"))
        return
    console.print(Text(f"{traffic_title(traffic)}:", "bold"))
    print_facts([(f"  {name}", value) for name, value in traffic_facts(traffic)], console)


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
