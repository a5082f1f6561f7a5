"""Logging for every llmgw process, configured once at its entry point by
``configure_logging``.

One format per process, on stderr: JSON lines (one object a line) or a console format for
people, chosen by ``LLMGW_LOG_FORMAT``: ``auto`` (the default: console on a terminal, JSON
otherwise), ``json`` or ``console``. structlog's lines and those of the libraries that log
through the standard library (uvicorn, websockets, asyncio, alembic) go through the same
processors to the same stream, so a log file never mixes formats. Every line has
``timestamp`` (UTC), ``level``, ``event`` and ``logger`` (the module, or the library's
logger). The libraries' info lines are kept (uvicorn's start and stop), but for those whose
info is per connection, per request or per migration step (``QUIET_LIBRARIES``), which log
warnings and errors only, unless the level is debug.

The rules every line follows:

- **The event is a fixed snake_case name**, subject first, then what happened or what is:
  ``agent_connected``, ``leader_elected``, ``reconcile_pass``, ``admin_request``. Never a
  sentence, never formatted with values: values are fields (``error``, ``reason``), and a
  sentence for the operator, where one helps, is the ``detail`` field. A test checks every
  call in the code.
- **Context is bound where it is known**, with structlog's contextvars, not repeated on
  every call: the agent hub's connection handler binds ``remote_address`` and, once the
  agent says hello, ``node_id``; the admin and gateway request handlers bind
  ``request_id``; the reconciler binds ``reconcile_pass`` for each pass and ``node_id``,
  ``replica_id`` and ``command_id`` for each command it sends; the gateway's scrape of one
  replica binds ``replica_id``; an agent binds its ``node_id`` for the whole process and
  ``replica_id`` and ``shard_index`` while it watches one shard.
- **Levels**: ``error``, something failed that a person must look at; ``warning``, something
  was refused or degraded, and handled; ``info``, a change an operator follows (connected,
  elected, placed, recorded); ``debug``, one line per request and other chatter.
- **Request lines** (``admin_request``, ``gateway_request``) are debug, so that polling,
  health checks and ordinary traffic write nothing at info, except a request answered 5xx
  (error) and a slow one (warning): ``request_level`` says which. Slow is
  ``SLOW_REQUEST_S``: for the admin API the whole request (event streams, long by design,
  aside), for the gateway its own share (admission queue and overhead), not the engine's
  generation.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Final, Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from app.usage_errors import print_command_error

LogFormat = Literal["auto", "json", "console"]
FORMATS: Final = ("auto", "json", "console")
LEVELS: Final = ("debug", "info", "warning", "error")
FORMAT_ENV = "LLMGW_LOG_FORMAT"

SLOW_REQUEST_S: Final = 1.0
"""A request line is a warning from this long on (see the module docstring)."""

QUIET_LIBRARIES: Final = ("websockets", "alembic", "httpx")
"""Standard-library loggers kept at warning unless the level is debug: websockets says
"connection open" and "connection closed" for every agent (the hub logs those itself, with
the node), alembic every migration step, httpx every request (an agent's readiness and
liveness checks of each engine, every few seconds for as long as it serves)."""

_LEADING_KEYS = ("timestamp", "level", "event", "logger")


class LogSettingsError(ValueError):
    """A log level or format that is not one of those listed."""


def configure_logging(
    level: str = "info",
    *,
    command: str,
    json: bool | None = None,
    stream: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Route every log line of this process through one set of processors to ``stream``
    (stderr). ``json`` forces the format; None reads ``LLMGW_LOG_FORMAT``. An unknown level
    or format ends the process with exit code 2 and a one-line error that starts with
    ``command`` (``llmgw-server serve: log level 'loud': ...``): it is called first thing at
    each entry point, before anything else is reported."""
    output = sys.stderr if stream is None else stream
    try:
        threshold = _threshold(level)
        use_json = _use_json(json, os.environ if environ is None else environ, output)
    except LogSettingsError as exc:
        print_command_error(command, str(exc))
        raise SystemExit(2) from None
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: list[Processor]
    if use_json:
        renderer = [structlog.processors.format_exc_info, _lead_with_the_essentials]
        renderer.append(structlog.processors.JSONRenderer())
    else:
        renderer = [
            structlog.dev.ConsoleRenderer(
                colors=output.isatty(), exception_formatter=structlog.dev.plain_traceback
            )
        ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(output)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
        )
    )
    root = logging.getLogger()
    for previous in list(root.handlers):
        root.removeHandler(previous)
    root.addHandler(handler)
    root.setLevel(threshold)
    quiet = threshold if threshold <= logging.DEBUG else max(threshold, logging.WARNING)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(quiet)
    logging.captureWarnings(True)


def request_level(status: int, slow_s: float) -> int:
    """The level of one request's line: error for a 5xx answer, warning from
    ``SLOW_REQUEST_S`` on, debug otherwise."""
    if status >= 500:
        return logging.ERROR
    if slow_s >= SLOW_REQUEST_S:
        return logging.WARNING
    return logging.DEBUG


def _threshold(level: str) -> int:
    if level.lower() not in LEVELS:
        raise LogSettingsError(f"log level {level!r}: expected one of {', '.join(LEVELS)}")
    return logging.getLevelNamesMapping()[level.upper()]


def _use_json(forced: bool | None, environ: Mapping[str, str], output: TextIO) -> bool:
    if forced is not None:
        return forced
    chosen = environ.get(FORMAT_ENV, "auto").strip().lower() or "auto"
    if chosen not in FORMATS:
        raise LogSettingsError(
            f"{FORMAT_ENV}={chosen!r}: expected one of {', '.join(FORMATS)} "
            "(auto: console on a terminal, JSON otherwise)"
        )
    if chosen == "auto":
        return not output.isatty()
    return chosen == "json"


def _lead_with_the_essentials(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """When, how bad, what and who first, so a JSON line reads left to right."""
    leading = {key: event.pop(key) for key in _LEADING_KEYS if key in event}
    return {**leading, **event}
