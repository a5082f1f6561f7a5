"""llmgw-cli: the operator's tool. A thin client of the admin REST API (and the local CA)."""

from __future__ import annotations

from cyclopts import App

from cli.cert import cert_app
from cli.history import history_app

app = App(
    name="llmgw-cli",
    help="Operate an llmgw cluster: nodes, models, replicas, drains, history, keys, certificates.",
)
app.command(cert_app)
app.command(history_app)


def main() -> None:
    app()
