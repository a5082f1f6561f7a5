"""llmgw-server: the control plane, the gateway and their maintenance commands."""

from __future__ import annotations

from cyclopts import App

from app.usage_errors import (
    one_line_usage_errors,
    output_console,
    run_program,
    usage_error_console,
)
from wire.version import llmgw_version

app = App(
    name="llmgw-server",
    version=llmgw_version,
    help="The llmgw control plane: event store, agent hub, reconciler, admin API, gateway."
    "\n\nExample: llmgw-server migrate --database-url postgresql://llmgw@db/llmgw",
    error_formatter=one_line_usage_errors("llmgw-server"),
    error_console=usage_error_console(),
    console=output_console(),
)
projections = App(
    name="projections",
    help="Maintain the tables projected from the event log.\n\n"
    "Example: llmgw-server projections rebuild --verify",
)
# Each command's module is imported when that command runs (or a help page lists it):
# ``log verify`` or ``migrate`` pays for neither the admin API nor the gateway.
app.command(projections)
app.command("app.commands.maintenance:migrate", name="migrate")
projections.command("app.commands.maintenance:rebuild_command", name="rebuild")
log = App(
    name="log",
    help="Check the event log against its chain hash.\n\n"
    "Example: llmgw-server log head; llmgw-server log verify --anchor POSITION:HASH",
)
app.command(log)
log.command("app.commands.log:verify_command", name="verify")
log.command("app.commands.log:head_command", name="head")
app.command("app.commands.serve:serve", name="serve")
app.command("app.commands.gateway:gateway_command", name="gateway")


def main() -> None:
    """The command line's command, quietly ended by its reader going away."""
    run_program(app)
