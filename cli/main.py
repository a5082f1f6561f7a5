"""llmgw-cli: the operator's tool. A thin client of the admin REST API (and the local CA)."""

from __future__ import annotations

import sys

from cyclopts import App

from app.usage_errors import run_program
from cli.autoscale import autoscale
from cli.bench.command import bench_app
from cli.cert import cert_app
from cli.cert_revocation import list_certificates, revoke_certificate
from cli.completion import register_completion
from cli.drain import drain, drain_progress
from cli.drain_cancel import drain_cancel
from cli.events import events
from cli.forget import forget
from cli.forget_ended import forget_ended
from cli.history import history_app
from cli.keys import keys_app
from cli.models import models_app, remove, scale, show_model
from cli.nodes import cordon, list_nodes, show_node, uncordon
from cli.placement import explain_placement
from cli.render import make_console
from cli.replicas import list_replicas, show_replica
from cli.rollout import rollout_app
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
app.command(list_nodes, name="nodes")
app.command(show_node, name="node")
app.command(models_app)
app.command(show_model, name="model")
app.command(scale, name="scale")
app.command(autoscale, name="autoscale")
app.command(remove, name="remove")
app.command(list_replicas, name="replicas")
app.command(show_replica, name="replica")
app.command(explain_placement, name="explain-placement")
app.command(cordon, name="cordon")
app.command(uncordon, name="uncordon")
app.command(drain, name="drain")
app.command(drain_progress, name="drain-progress")
app.command(drain_cancel, name="drain-cancel")
app.command(forget, name="forget")
app.command(forget_ended, name="forget-ended")
app.command(rollout_app)
app.command(events, name="events")
cert_app.command(revoke_certificate, name="revoke")
cert_app.command(list_certificates, name="list")
app.command(cert_app)
app.command(history_app)
app.command(keys_app)
app.command(bench_app)
register_completion(app)


EXIT_INTERRUPTED = 130
"""Ctrl-C: 128 + SIGINT, as a shell reports a program the signal stopped."""


def main() -> None:
    """The command line's command, quietly stopped by Ctrl-C or by its reader going away."""
    try:
        run_program(app)  # its reader going away: EXIT_OUTPUT_CLOSED, quietly
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
