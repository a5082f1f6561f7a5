"""What every operator command shares: the connection, exit codes, `--output`, JSON output.

A command is a few lines: resolve the settings, call the API, render. ``run_command`` turns
the failures into a one-line message on stderr and the exit code the README promises:
0 done, 1 failed (the API refused or could not be reached), 2 bad usage (a bad flag, an
unusable config file).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Generic, Literal, Protocol, TypeVar

import msgspec
from cyclopts import Parameter
from rich.console import Console

from cli import replica_pages
from cli.arguments import UsageError, segment
from cli.client import ADMIN, UNREADABLE, AdminClient, ApiProblem, ClientError, unreadable
from cli.config import ConfigError, ConnectionFlags, resolve_settings
from cli.render import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    print_error,
    print_json,
    say,
    styled,
    warn,
)
from cli.views import ApplyPreview, ModelChange, ModelView, NodeSummary, ReplicaSummary

OutputFormat = Literal["table", "wide", "json"]
Output = Annotated[
    OutputFormat,
    Parameter(
        help="table for people (columns that do not fit the terminal are left out, in a "
        "stated order); wide for every column however wide; json for scripts (the API's "
        "answer, unchanged)."
    ),
]

ViewT = TypeVar("ViewT")


class Change(Protocol):
    """An answer to a change that may find nothing to do (and then records nothing)."""

    @property
    def changed(self) -> bool: ...


ChangeT = TypeVar("ChangeT", bound=Change)


@dataclass(frozen=True)
class Reply(Generic[ViewT]):
    """An answer of the API: decoded for the table, and as it came for ``--output json``."""

    value: ViewT
    raw: bytes


def run_command(
    command: str, flags: ConnectionFlags | None, action: Callable[[AdminClient], int]
) -> int:
    """``action`` with a client of the configured admin API; its exit code, or 1 or 2 with
    a message when it fails."""
    try:
        settings = resolve_settings(flags or ConnectionFlags())
        with AdminClient(settings) as client:
            return action(client)
    except (ConfigError, UsageError) as exc:
        print_error(command, str(exc))
        return EXIT_USAGE
    except ClientError as exc:
        print_error(command, str(exc))
        if isinstance(exc, ApiProblem):
            for error in exc.errors:
                warn(f"  {error.field}: {error.reason}")
        return EXIT_FAILED


def call(
    client: AdminClient,
    view: type[ViewT],
    method: str,
    path: str,
    *,
    params: Mapping[str, int | str] | None = None,
    body: object = None,
) -> Reply[ViewT]:
    raw = client.request(method, path, params=params, body=body)
    try:
        return Reply(msgspec.json.decode(raw, type=view), raw)
    except UNREADABLE as exc:
        raise unreadable("an answer", exc) from exc


# -- calls that commands and scripts share ----------------------------------------------


def get_nodes(client: AdminClient) -> Reply[list[NodeSummary]]:
    """Every node the log knows."""
    return call(client, list[NodeSummary], "GET", f"{ADMIN}/nodes")


def get_model(client: AdminClient, name: str) -> Reply[ModelView] | None:
    """The model ``name``; None when the log has never declared it."""
    try:
        return call(client, ModelView, "GET", f"{ADMIN}/models/{segment(name, 'the model name')}")
    except ApiProblem as exc:
        if exc.status == 404:
            return None
        raise


def put_model(client: AdminClient, spec: Mapping[str, object]) -> Reply[ModelChange]:
    """Declare the model ``spec["name"]`` with ``spec`` (recorded only if it changes)."""
    path = f"{ADMIN}/models/{segment(str(spec['name']), 'the model name')}"
    return call(client, ModelChange, "PUT", path, body=dict(spec))


def preview_model(client: AdminClient, spec: Mapping[str, object]) -> Reply[ApplyPreview]:
    """What declaring ``spec`` would do, validated as a declaration is; nothing recorded."""
    path = f"{ADMIN}/models/{segment(str(spec['name']), 'the model name')}/preview"
    return call(client, ApplyPreview, "POST", path, body=dict(spec))


def get_replicas(
    client: AdminClient,
    *,
    model: str | None = None,
    node: str | None = None,
    phase: str | None = None,
) -> Reply[list[ReplicaSummary]]:
    """Replicas, ended ones too, only those of ``model``, on ``node`` or in ``phase`` when
    given: read page after page as ``llmgw-cli replicas --all`` reads them
    (``cli.replica_pages``), so that a fleet of more than a page is listed whole; ``raw``
    is their JSON array, each replica as the API sent it."""
    filters = {"model": model, "node": node, "phase": phase}
    given = {name: value for name, value in filters.items() if value is not None}
    listed = replica_pages.list_replicas(client, given, ended=True).replicas
    raw = b"[" + b",".join(replica.raw for replica in listed) + b"]"
    return Reply([replica.view for replica in listed], raw)


def show_one(
    command: str,
    path: Callable[[], str],
    view: type[ViewT],
    print_view: Callable[[ViewT, bool], None],
    output: OutputFormat,
    flags: ConnectionFlags | None,
) -> int:
    """``GET path()`` and print the one thing it answers (``llmgw-cli node``, ``model``...).
    The path is built within ``run_command``: a name that cannot be a path segment is a
    usage error like any other."""

    def show(client: AdminClient) -> int:
        print_reply(call(client, view, "GET", path()), output, print_view)
        return EXIT_OK

    return run_command(command, flags, show)


def post_change(
    command: str,
    path: Callable[[], str],
    view: type[ChangeT],
    body: object,
    output: OutputFormat,
    flags: ConnectionFlags | None,
    *,
    done: str | Callable[[ChangeT], str],
    unchanged: str | Callable[[ChangeT], str],
) -> int:
    """``POST path()`` for a change (``llmgw-cli scale``, ``cordon``...) and print the API's
    answer for ``--output json``, else ``done``, or ``unchanged`` when nothing was recorded
    (either one made from the answer, when it says what the thing is now). The path is
    built within ``run_command``, as ``show_one``'s."""

    def change(client: AdminClient) -> int:
        reply = call(client, view, "POST", path(), body=body)
        if output == "json":
            print_json(reply.raw)
        else:
            said = done if reply.value.changed else unchanged
            say(said if isinstance(said, str) else said(reply.value))
        return EXIT_OK

    return run_command(command, flags, change)


def print_reply(
    reply: Reply[ViewT], output: OutputFormat, print_view: Callable[[ViewT, bool], None]
) -> None:
    """The API's answer unchanged for ``--output json``; ``print_view``'s rendering else
    (told whether the output is to be ``wide``)."""
    if output == "json":
        print_json(reply.raw)
    else:
        print_view(reply.value, output == "wide")


def yes_no(value: bool) -> str:
    return "yes" if value else "no"


def labels_text(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def print_facts(facts: Sequence[tuple[str, str | None]], console: Console) -> None:
    """``name: value`` lines, values aligned; values are plain text, escaped, never markup."""
    width = max((len(name) for name, _ in facts), default=0) + 2
    for name, value in facts:
        console.print(styled((f"{name}:".ljust(width), "bold"), value or "-"))
