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
app.command("cli.nodes:list_nodes", name="nodes")
app.command("cli.nodes:show_node", name="node")
app.command("cli.models:models_app", name="models")
app.command("cli.models:show_model", name="model")
app.command("cli.models:scale", name="scale")
app.command("cli.autoscale:autoscale", name="autoscale")
app.command("cli.models:remove", name="remove")
app.command("cli.replicas:list_replicas", name="replicas")
app.command("cli.replicas:show_replica", name="replica")
app.command("cli.placement:explain_placement", name="explain-placement")
app.command("cli.nodes:cordon", name="cordon")
app.command("cli.nodes:uncordon", name="uncordon")
app.command("cli.drain:drain", name="drain")
app.command("cli.drain:drain_progress", name="drain-progress")
app.command("cli.drain_cancel:drain_cancel", name="drain-cancel")
app.command("cli.forget:forget", name="forget")
app.command("cli.forget_ended:forget_ended", name="forget-ended")
app.command("cli.rollout:rollout_app", name="rollout")
app.command("cli.events:events", name="events")
app.command("cli.cert:cert_app", name="cert")
app.command("cli.history:history_app", name="history")
app.command("cli.keys:keys_app", name="keys")
app.command("cli.bench.command:bench_app", name="bench")
register_completion(app)


EXIT_INTERRUPTED = 130
"""Ctrl-C: 128 + SIGINT, as a shell reports a program the signal stopped."""


def main() -> None:
    """The command line's command, quietly stopped by Ctrl-C or by its reader going away."""
    try:
        run_program(app)  # its reader going away: EXIT_OUTPUT_CLOSED, quietly
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
