"""Every log line's event is a fixed snake_case name (app/logs.py's rule): read off the
source of every package, so a sentence or an f-string cannot slip in unnoticed."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "agent", "cli", "wire")
LEVELS = frozenset({"debug", "info", "warning", "error", "exception", "critical", "log"})
EVENT_NAME = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


def structlog_loggers(tree: ast.Module) -> set[str]:
    """Names bound to ``structlog.get_logger(...)`` at module level."""
    names = set()
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) == "structlog.get_logger"
        ):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def log_calls(path: Path) -> Iterator[tuple[int, ast.expr | None]]:
    """(line, the event argument) of every call of a level method on a module's logger."""
    tree = ast.parse(path.read_text(), str(path))
    loggers = structlog_loggers(tree)
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LEVELS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in loggers
        ):
            continue
        arguments = node.args[1:] if node.func.attr == "log" else node.args
        yield node.lineno, arguments[0] if arguments else None


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


def test_the_rule_sees_the_calls_it_judges() -> None:
    """Not vacuous: the hub's lines are found, and a sentence would be refused."""
    hub = ROOT / "app" / "hub" / "hub.py"
    events = [e.value for _, e in log_calls(hub) if isinstance(e, ast.Constant)]
    assert "agent_connected" in events
    assert not EVENT_NAME.fullmatch("agent connected")
    assert not EVENT_NAME.fullmatch("subscription.read_failed")
