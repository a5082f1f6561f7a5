"""`llmgw-cli keys ...`: create API keys (each shown once), list and revoke them.

Exit codes: 0 done (revoking a revoked key too), 1 failed (the API refused or could not be
reached), 2 bad usage (a bad flag, an unusable config file).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from cyclopts import App, Parameter

from cli import key_requests
from cli.arguments import UsageError, WholeNumberWithin, duration, filled, moment
from cli.client import AdminClient
from cli.config import ConnectionFlags
from cli.key_requests import KeyView
from cli.operator import run_command
from cli.render import (
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
once, when it is created: only its hash is stored. A key may expire: from then on every
gateway refuses it (401, saying when it expired), with nothing to revoke.

```
llmgw-cli keys create --name ci --models demo --rpm 60
llmgw-cli keys create --name contractor --models demo --expires-in 30d
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
    Parameter(converter=WholeNumberWithin(1, 2**31 - 1)),
]

MAX_LIFETIME = timedelta(days=3653)
"""The furthest ahead a key may expire, as the admin API has it: ten years, leap days
included."""

COLUMNS = (
    Column("prefix", key=True),
    Column("name", key=True),
    Column("state"),
    Column("models", wrap=True),
    Column("rpm", justify="right"),
    Column("tpm", justify="right"),
    Column("expires (UTC)"),
    # A "by" goes before its time, so a "by" left on screen always follows its time.
    Column("created (UTC)", drop=5),
    Column("by", drop=3),
    Column("revoked (UTC)", drop=4),
    Column("by", drop=2),
    Column("id", drop=1),
)


@keys_app.command(name="create")
def create_key(
    *,
    name: Annotated[
        str,
        Parameter(
            converter=filled,
            help="What the key is for, unique among live keys (e.g. ci-pipeline).",
        ),
    ],
    models: Annotated[
        str,
        Parameter(help="Comma-separated model names the key may use; '*' for every model."),
    ],
    rpm: Annotated[Limit, Parameter(help="Requests per minute. [default: no limit]")] = None,
    tpm: Annotated[Limit, Parameter(help="Tokens per minute. [default: no limit]")] = None,
    expires_in: Annotated[
        timedelta | None,
        Parameter(
            converter=duration,
            metavar="SPAN",
            help="The key stops working this long from now, by the server's clock (this "
            "machine's may be off): a whole number and s, m, h, d or w (90m, 12h, 30d, 2w), at "
            "most 10 years. [default: never]",
        ),
    ] = None,
    expires_at: Annotated[
        datetime | None,
        Parameter(
            converter=moment,
            metavar="TIME",
            help="The key stops working at this time: ISO 8601 with a timezone "
            "(2027-01-31T00:00:00Z), in the future, at most 10 years ahead. Not with "
            "--expires-in. [default: never]",
        ),
    ] = None,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Create an API key and print it, this once. With --expires-in or --expires-at it
    stops working at that time: every gateway refuses it from then on (401, saying when
    it expired), no revocation needed. When the answer is lost, the creation is sent once
    more with the same Idempotency-Key; if the first had created the key, whose secret only
    the lost answer held, that key is revoked and another created in its place, saying so
    on stderr.

    ```
    llmgw-cli keys create --name ci --models llama-3-8b,qwen-2-7b --rpm 60 --tpm 100000
    llmgw-cli keys create --name notebook --models '*' --output json | jq -r .key
    llmgw-cli keys create --name contractor --models llama-3-8b --expires-in 30d
    llmgw-cli keys create --name demo --models '*' --expires-at 2027-01-31T00:00:00Z
    ```
    """
    scope = [model.strip() for model in models.split(",") if model.strip()]
    if not scope:
        print_error("keys create", f"--models names no model; give names, or {ALL_MODELS!r}")
        return EXIT_USAGE
    repeated = key_requests.repeated_models(scope)
    if repeated:
        print_error("keys create", f"--models: {'; '.join(repeated)}")
        return EXIT_USAGE
    try:
        until = expiry(expires_in, expires_at, datetime.now(UTC))
    except UsageError as exc:
        print_error("keys create", str(exc))
        return EXIT_USAGE

    def create(client: AdminClient) -> int:
        if expires_in is not None:
            # A span, counted by the server's clock: this machine's may be off.
            lifetime_s = expires_in.total_seconds()
            created = key_requests.create_key(
                client, name, scope, rpm=rpm, tpm=tpm, expires_in_s=lifetime_s
            )
        else:
            created = key_requests.create_key(
                client, name, scope, rpm=rpm, tpm=tpm, expires_at=until
            )
        if created.replaced is not None:
            warn(
                f"The answer to this key creation was lost: "
                f"{key_requests.lost_words(created.replaced)}: it was revoked, and this key "
                "created in its place."
            )
        reply = created.reply
        if output == "json":
            print_json(reply.raw)
        else:
            key = reply.value
            say(f"Created API key {key.name} ({_scope_text(key)}; {_limits(key)})")
            say(f"prefix {key.prefix}, id {key.id}, {_expiry_text(key)}")
            say()
            say(f"    {key.key}")
            say()
        warn(SHOWN_ONCE)
        return EXIT_OK

    return run_command("keys create", connection, create)


@keys_app.command(name="list")
def list_keys(
    *,
    live: Annotated[bool, Parameter(help="Leave revoked and expired keys out.")] = False,
    output: Output = "table",
    connection: ConnectionFlags | None = None,
) -> int:
    """Every API key, oldest first: prefix, name, state (live, expired or revoked),
    models, limits, when it expires, who created it and when, and who revoked it and
    when. Never a secret. Whether a key has expired is the server's clock's say. The keys
    are read from the admin API 500 at a time, page after page (2,000 pages at most: a
    server still sending more fails the command, as does a page repeating a key listed
    already), and printed as one list (--output json: one JSON array).

    ```
    llmgw-cli keys list
    llmgw-cli keys list --live --output json | jq -r '.[].prefix'
    llmgw-cli keys list --output json | jq -r '.[] | select(.expired) | .name'
    ```
    """

    def show(client: AdminClient) -> int:
        listed = key_requests.list_keys(client)
        kept = [key for key in listed if not (live and _state(key.view) != "live")]
        if output == "json":
            print_json_array(key.raw for key in kept)
            return EXIT_OK
        shown = [key.view for key in kept]
        live_count = sum(1 for key in listed if _state(key.view) == "live")
        title = f"{counted(len(shown), 'API key')} ({live_count} live)"
        print_table(COLUMNS, (_row(key) for key in shown), title=title, wide=output == "wide")
        return EXIT_OK

    return run_command("keys list", connection, show)


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
    changes nothing and is no error. A name finds its live key, else its expired key not
    yet revoked; when several keys of the name could be meant, give the prefix.

    ```
    llmgw-cli keys revoke ci-pipeline
    llmgw-cli keys revoke 7f3a09c2
    ```
    """
    if not prefix_or_name.strip():
        print_error("keys revoke", "give the key's prefix or name")
        return EXIT_USAGE

    def revoke(client: AdminClient) -> int:
        reply = key_requests.revoke_key(client, prefix_or_name)
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

    return run_command("keys revoke", connection, revoke)


def expiry(
    expires_in: timedelta | None, expires_at: datetime | None, now: datetime
) -> datetime | None:
    """When a key created ``now`` expires, by the flags given (None: never); a
    ``UsageError`` for both flags, or for a time past or more than 10 years ahead. The
    admin API checks again by its own clock."""
    if expires_in is not None and expires_at is not None:
        raise UsageError("give --expires-in or --expires-at, not both")
    if expires_in is not None:
        if expires_in <= timedelta(0):
            raise UsageError("--expires-in must be longer than 0")
        if expires_in > MAX_LIFETIME:
            raise UsageError("--expires-in must be at most 10 years (3653d)")
        return now + expires_in
    if expires_at is not None:
        if expires_at <= now:
            raise UsageError(
                f"--expires-at {expires_at.isoformat()} is not in the future (it is "
                f"{utc_seconds(now)} UTC now)"
            )
        if expires_at - now > MAX_LIFETIME:
            raise UsageError(
                f"--expires-at {expires_at.isoformat()} is more than 10 years ahead (at most "
                f"{utc_seconds(now + MAX_LIFETIME)} UTC)"
            )
    return expires_at


def _scope_text(key: KeyView) -> str:
    if key.models == [ALL_MODELS]:
        return "every model"
    return "models " + ", ".join(key.models)


def _limits(key: KeyView) -> str:
    rpm = f"{key.rpm} requests/min" if key.rpm is not None else "no request limit"
    tpm = f"{key.tpm} tokens/min" if key.tpm is not None else "no token limit"
    return f"{rpm}, {tpm}"


def _expiry_text(key: KeyView) -> str:
    if key.expires_at is None:
        return "never expires"
    return f"expires {utc_seconds(key.expires_at)} UTC"


def _state(key: KeyView) -> str:
    """``revoked``, ``expired`` or ``live``: a key revoked after it expired is revoked."""
    if key.revoked:
        return "revoked"
    return "expired" if key.expired else "live"


def _row(key: KeyView) -> tuple[str, ...]:
    return (
        key.prefix,
        key.name,
        _state(key),
        ", ".join(key.models),
        "-" if key.rpm is None else str(key.rpm),
        "-" if key.tpm is None else str(key.tpm),
        utc_seconds(key.expires_at) if key.expires_at else "never",
        utc_seconds(key.created_at),
        key.created_by,
        utc_seconds(key.revoked_at) if key.revoked_at else "",
        key.revoked_by or "",
        key.id,
    )
