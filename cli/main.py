"""llmgw-cli: the operator's tool. A thin client of the admin REST API (and the local CA)."""

from __future__ import annotations

import sys

from cyclopts import App

from app.usage_errors import run_program
from cli.completion import register_completion
from cli.render import make_console
from cli.usage_errors import usage_error_console, usage_error_line
from wire.version import llmgw_version

app = App(
    name="llmgw-cli",
    version=llmgw_version,
    help="Operate an llmgw cluster: nodes, models, replicas, autoscaling, drains, rollouts, "
    "history, keys, certificates."
    "\n\nEvery change is sent with an Idempotency-Key of its own. When its answer is lost "
    "(the connection broke after it went out), it is sent once more with the same key, which "
    "the admin API carries out at most once: answered, the command ends as if the first "
    "answer had come. Lost again, the command exits 1 saying that the change, sent twice "
    "with the same key, may have been carried out (once at most): see what the log recorded "
    "(`llmgw-cli events --last 20`) before running it again, which sends it with a new key "
    "(docs/admin-api.md, Sending a change again). A script that retries across runs gives "
    "a key of its own with --idempotency-key: run again with it, the command is carried out "
    "at most once."
    "\n\nShell completion: `llmgw-cli --install-completion`, or "
    '`eval "$(llmgw-cli completion bash)"`.'
    "\n\nExample: llmgw-cli nodes --admin-url http://127.0.0.1:8081",
    error_formatter=usage_error_line,
    error_console=usage_error_console(),
    console=make_console(),
)
# Each command's module is imported when that command runs (or ``--help`` lists them all):
# a command pays for its own imports alone, the local CA's none of the HTTP client's.
_COMMANDS = (
    ("nodes", "cli.nodes:list_nodes"),
    ("node", "cli.nodes:show_node"),
    ("models", "cli.models:models_app"),
    ("model", "cli.models:show_model"),
    ("scale", "cli.models:scale"),
    ("autoscale", "cli.autoscale:autoscale"),
    ("remove", "cli.models:remove"),
    ("replicas", "cli.replicas:list_replicas"),
    ("replica", "cli.replicas:show_replica"),
    ("explain-placement", "cli.placement:explain_placement"),
    ("cordon", "cli.nodes:cordon"),
    ("uncordon", "cli.nodes:uncordon"),
    ("drain", "cli.drain:drain"),
    ("drain-progress", "cli.drain:drain_progress"),
    ("drain-cancel", "cli.drain_cancel:drain_cancel"),
    ("forget", "cli.forget:forget"),
    ("forget-ended", "cli.forget_ended:forget_ended"),
    ("rollout", "cli.rollout:rollout_app"),
    ("events", "cli.events:events"),
    ("cert", "cli.cert:cert_app"),
    ("history", "cli.history:history_app"),
    ("keys", "cli.keys:keys_app"),
    ("bench", "cli.bench.command:bench_app"),
)
for _name, _where in _COMMANDS:
    app.command(_where, name=_name)
register_completion(app)


EXIT_INTERRUPTED = 130
"""Ctrl-C: 128 + SIGINT, as a shell reports a program the signal stopped."""


def main() -> None:
    """The command line's command, quietly stopped by Ctrl-C or by its reader going away."""
    try:
        run_program(app)  # its reader going away: EXIT_OUTPUT_CLOSED, quietly
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
