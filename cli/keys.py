"""`llmgw-cli keys ...`: create API keys (each shown once), list and revoke them.

Exit codes: 0 done (revoking a revoked key too), 1 failed (the API refused or could not be
reached), 2 bad usage (a bad flag, an unusable config file).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

import msgspec
from cyclopts import App, Parameter, validators

from cli.arguments import UsageError, whole_number
from cli.client import AdminClient, ClientError, KeyView
from cli.config import ConfigError, ConnectionFlags, resolve_settings
from cli.render import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Column,
    counted,
    print_error,
    print_json,
    print_json_array,
    print_table,
    say,
    utc_seconds,
    warn,
)

keys_app = App(
    name="keys",
    help="""Create, list and revoke the API keys clients use at the gateway. A key is shown
once, when it is created: only its hash is stored.

```
llmgw-cli keys create --name ci --models demo --rpm 60
llmgw-cli keys list --live
llmgw-cli keys revoke ci
```
""",
)

ALL_MODELS = "*"
SHOWN_ONCE = (
    "Store this key now: it is shown this once and cannot be shown again (only its hash is "
    "kept). Lost keys are revoked and replaced, never recovered."
)

Output = Annotated[
    Literal["table", "wide", "json"],
    Parameter(
        help="table for people (columns that do not fit the terminal are left out, in a "
        "stated order); wide for every column however wide; json prints the API's answer "
        "unchanged."
    ),
]
Limit = Annotated[
    int | None,
    Parameter(converter=whole_number, validator=validators.Number(gte=1, lte=2**31 - 1)),
]

COLUMNS = (
    Column("prefix", key=True),
    Column("name", key=True),
    Column("models", wrap=True),
    Column("rpm", justify="right"),
    Column("tpm", justify="right"),
    Column("created (UTC)", drop=3),
    Column("by", drop=4),
    Column("revoked (UTC)", drop=2),
    Column("by", drop=5),
    Column("id", drop=1),
)


@keys_app.command(name="create")
def create_key(
    *,
    name: Annotated[
        str, Parameter(help="What the key is for, unique among live keys (e.g. ci-pipeline).")
    ],
    models: Annotated[
        str,
        Parameter(help="Comma-separated model names the key may use; '*' for every model."),
    ],
    rpm: Annotated[Limit, Parameter(help="Requests per minute. [default: no limit]")] = None,
    tpm: Annotated[Limit, Parameter(help="Tokens per minute. [default: no limit]")] = None,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Create an API key and print it, this once.

    ```
    llmgw-cli keys create --name ci --models llama-3-8b,qwen-2-7b --rpm 60 --tpm 100000
    llmgw-cli keys create --name notebook --models '*' --output json | jq -r .key
    ```
    """
    scope = [model.strip() for model in models.split(",") if model.strip()]
    if not scope:
        print_error("keys create", f"--models names no model; give names, or {ALL_MODELS!r}")
        return EXIT_USAGE

    def create(client: AdminClient) -> int:
        reply = client.create_key(name, scope, rpm=rpm, tpm=tpm)
        if output == "json":
            print_json(reply.raw)
        else:
            created = reply.value
            say(f"Created API key {created.name} ({_scope_text(created)}; {_limits(created)})")
            say(f"prefix {created.prefix}, id {created.id}")
            say()
            say(f"    {created.key}")
            say()
        warn(SHOWN_ONCE)
        return EXIT_OK

    return _run("keys create", connection, create)


@keys_app.command(name="list")
def list_keys(
    *,
    live: Annotated[bool, Parameter(help="Leave revoked keys out.")] = False,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Every API key, oldest first: prefix, name, models, limits, who created it and when,
    and who revoked it and when. Never a secret.

    ```
    llmgw-cli keys list
    llmgw-cli keys list --live --output json | jq -r '.[].prefix'
    ```
    """

    def show(client: AdminClient) -> int:
        reply = client.list_keys()
        as_sent = msgspec.json.decode(reply.raw, type=list[msgspec.Raw])
        kept = [
            (key, raw)
            for key, raw in zip(reply.value, as_sent, strict=True)
            if not (live and key.revoked)
        ]
        if output == "json":
            print_json_array(raw for _, raw in kept)
            return EXIT_OK
        shown = [key for key, _ in kept]
        live_count = sum(1 for key in reply.value if not key.revoked)
        title = f"{counted(len(shown), 'API key')} ({live_count} live)"
        print_table(COLUMNS, (_row(key) for key in shown), title=title, wide=output == "wide")
        return EXIT_OK

    return _run("keys list", connection, show)


@keys_app.command(name="revoke")
def revoke_key(
    prefix_or_name: Annotated[
        str, Parameter(help="The key's prefix (8 hex characters, see `keys list`) or its name.")
    ],
    /,
    *,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Revoke an API key: every gateway refuses it within a second. Revoking a revoked key
    changes nothing and is no error.

    ```
    llmgw-cli keys revoke ci-pipeline
    llmgw-cli keys revoke 7f3a09c2
    ```
    """
    if not prefix_or_name.strip():
        print_error("keys revoke", "give the key's prefix or name")
        return EXIT_USAGE

    def revoke(client: AdminClient) -> int:
        reply = client.revoke_key(prefix_or_name)
        if output == "json":
            print_json(reply.raw)
            return EXIT_OK
        key = reply.value.key
        if reply.value.changed:
            say(f"Revoked API key {key.name} (prefix {key.prefix}).")
        else:
            when = utc_seconds(key.revoked_at) + " UTC" if key.revoked_at else "before"
            say(
                f"API key {key.name} (prefix {key.prefix}) was already revoked by "
                f"{key.revoked_by or 'someone'} at {when}; nothing changed."
            )
        return EXIT_OK

    return _run("keys revoke", connection, revoke)


def _run(command: str, flags: ConnectionFlags | None, action: Callable[[AdminClient], int]) -> int:
    try:
        settings = resolve_settings(flags or ConnectionFlags())
    except ConfigError as exc:
        print_error(command, str(exc))
        return EXIT_USAGE
    try:
        with AdminClient(settings) as client:
            return action(client)
    except UsageError as exc:
        print_error(command, str(exc))
        return EXIT_USAGE
    except ClientError as exc:
        print_error(command, str(exc))
        return EXIT_FAILED


def _scope_text(key: KeyView) -> str:
    if key.models == [ALL_MODELS]:
        return "every model"
    return "models " + ", ".join(key.models)


def _limits(key: KeyView) -> str:
    rpm = f"{key.rpm} requests/min" if key.rpm is not None else "no request limit"
    tpm = f"{key.tpm} tokens/min" if key.tpm is not None else "no token limit"
    return f"{rpm}, {tpm}"


def _row(key: KeyView) -> tuple[str, ...]:
    return (
        key.prefix,
        key.name,
        ", ".join(key.models),
        "-" if key.rpm is None else str(key.rpm),
        "-" if key.tpm is None else str(key.tpm),
        utc_seconds(key.created_at),
        key.created_by,
        utc_seconds(key.revoked_at) if key.revoked_at else "",
        key.revoked_by or "",
        key.id,
    )
