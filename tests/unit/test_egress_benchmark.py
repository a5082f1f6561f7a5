"""``benchmarks/egress.py`` measures its gateway figures at any route count, a quarter of the
routes refused by the engine networks, rounded down."""

from __future__ import annotations

from benchmarks.egress import gateway_figures


def test_the_gateway_figures_are_measured_at_a_route_count_four_does_not_divide() -> None:
    figures = gateway_figures(50, repeat=1)

    assert [f.name for f in figures if "a quarter refused" in f.name] == [
        "egress, new table, a quarter refused",
        "egress, same table again, a quarter refused",
    ]
