"""The files a bench run writes into its report directory, named where the run writes them
and where ``--report-dir`` is checked before the climb."""

from __future__ import annotations

REPORT_FILE = "bench.json"
CHART_FILE = "bench.png"
