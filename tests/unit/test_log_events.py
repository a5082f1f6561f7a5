"""Every log line's event is a fixed snake_case name (app/logs.py's rule): read off the
source of every package, so a sentence or an f-string cannot slip in unnoticed. A logger is
found however a module comes by it: ``structlog.get_logger`` or the standard library's
``logging.getLogger`` at module level, imported from a module that made one, or bound from
one (``log.bind(...)``, ``log.new(...)``) anywhere in the module."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "agent", "cli", "wire", "devcluster")
LEVELS = frozenset({"debug", "info", "warning", "error", "exception", "critical", "log"})
EVENT_NAME = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


LOGGER_FACTORIES = frozenset({"structlog.get_logger", "logging.getLogger"})
BINDINGS = frozenset({"bind", "new"})


def structlog_loggers(tree: ast.Module) -> set[str]:
    """Names bound at module level to a logger: ``structlog.get_logger(...)`` or the
    standard library's ``logging.getLogger(...)``, whose lines go through the same
    processors (app/logs.py)."""
    names = set()
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) in LOGGER_FACTORIES
        ):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


@functools.cache
def module_loggers(path: Path) -> frozenset[str]:
    return frozenset(structlog_loggers(ast.parse(path.read_text(), str(path))))


def imported_loggers(tree: ast.Module) -> set[str]:
    """Names imported from a module of the packages that binds them to a logger
    (``from app.gateway.exchange_steps import log``)."""
    names = set()
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
            continue
        source = ROOT.joinpath(*node.module.split(".")).with_suffix(".py")
        if node.module.split(".")[0] not in PACKAGES or not source.is_file():
            continue
        theirs = module_loggers(source)
        names |= {alias.asname or alias.name for alias in node.names if alias.name in theirs}
    return names


def bound_loggers(tree: ast.Module, loggers: set[str]) -> set[str]:
    """Names assigned, anywhere in the module, a logger bound from one of ``loggers``
    (``line = log.bind(replica_id=...)``), followed through chains of bindings."""
    bound = set(loggers)
    while True:
        found = {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr in BINDINGS
            and isinstance(node.value.func.value, ast.Name)
            and node.value.func.value.id in bound
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        if found <= bound:
            return bound
        bound |= found


def log_calls(path: Path) -> Iterator[tuple[int, ast.expr | None]]:
    """(line, the event argument) of every call of a level method on a module's logger."""
    for line, _, event in leveled_log_calls(path):
        yield line, event


def leveled_log_calls(path: Path) -> Iterator[tuple[int, str | None, ast.expr | None]]:
    """(line, level, the event argument) of every call of a level method on a module's
    logger: ``exception`` is an error, and ``log(level, ...)`` has the level only where it
    is a constant such as ``logging.WARNING`` (None where it is worked out)."""
    tree = ast.parse(path.read_text(), str(path))
    loggers = bound_loggers(tree, structlog_loggers(tree) | imported_loggers(tree))
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LEVELS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in loggers
        ):
            continue
        level: str | None = node.func.attr
        arguments = node.args
        if level == "log":
            given = ast.unparse(node.args[0]) if node.args else ""
            level = given.removeprefix("logging.").lower() if given.startswith("logging.") else None
            arguments = node.args[1:]
        elif level == "exception":
            level = "error"
        yield node.lineno, level, arguments[0] if arguments else None


def offences() -> Iterator[str]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, event in log_calls(path):
                where = f"{path.relative_to(ROOT)}:{line}"
                if not (isinstance(event, ast.Constant) and isinstance(event.value, str)):
                    yield f"{where}: the event is not a fixed string"
                elif not EVENT_NAME.fullmatch(event.value):
                    yield f"{where}: {event.value!r} is not a snake_case event name"


def test_every_event_is_a_fixed_snake_case_name() -> None:
    assert list(offences()) == []


def events_of(path: Path) -> list[str]:
    return [
        e.value
        for _, e in log_calls(path)
        if isinstance(e, ast.Constant) and isinstance(e.value, str)
    ]


def test_the_rule_sees_the_calls_it_judges() -> None:
    """Not vacuous: the hub's lines are found, and a sentence would be refused."""
    assert "agent_connected" in events_of(ROOT / "app" / "hub" / "hub.py")
    assert not EVENT_NAME.fullmatch("agent connected")
    assert not EVENT_NAME.fullmatch("subscription.read_failed")


def test_the_rule_sees_loggers_imported_bound_or_from_the_standard_library(
    tmp_path: Path,
) -> None:
    """A logger imported from another module (the gateway's routes log on the exchange
    steps' logger), one bound from another, and one of the standard library's are read too."""
    served_route = ROOT / "app" / "gateway" / "served_route.py"
    assert "gateway_request_failed" in events_of(served_route)
    module = tmp_path / "lines.py"
    module.write_text(
        "import logging\n"
        "import structlog\n"
        "plain = logging.getLogger(__name__)\n"
        "log = structlog.get_logger()\n"
        "def watch() -> None:\n"
        "    line = log.bind(replica_id='m-1')\n"
        "    again = line.new()\n"
        "    plain.error('Something broke.')\n"
        "    again.warning('replica_watched')\n"
    )
    assert events_of(module) == ["Something broke.", "replica_watched"]
