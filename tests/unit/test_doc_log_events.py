"""Every log event the docs tell operators to look for is one the code logs: a renamed or
never-written event would leave a filter on it matching nothing, silently. Read off the
docs' wording ("logs `x`", "logged as `x`", "the warning `x`", the agent's list of its
lines) and off the source, with test_log_events' reading of the log calls."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from tests.unit.test_log_events import PACKAGES, ROOT, log_calls

DOCS = ROOT / "docs"
SNAKE = r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+"
EVENT = r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*"
NAMED_AS_LOGGED = re.compile(
    rf"(?:\blogs|\blogged (?:once )?as|\blogging|\bthe warning|\bwarns|\blog line)\s+`({SNAKE})`"
)
AGENT_LINES = re.compile(r"one line per event:(.*?)Every line carries", re.DOTALL)
PARENTHESES = re.compile(r"\([^()]*\)")


def logged_events() -> set[str]:
    return {
        event.value
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for _, event in log_calls(path)
        if isinstance(event, ast.Constant) and isinstance(event.value, str)
    }


def quoted_events() -> Iterator[tuple[str, str]]:
    """(doc, event) for every event a doc says is logged."""
    for doc in sorted(DOCS.glob("*.md")):
        text = re.sub(r"\s+", " ", doc.read_text())
        for match in NAMED_AS_LOGGED.finditer(text):
            yield doc.name, match[1]
    # The agent's list of its lines; the fields some carry are in parentheses.
    listing = AGENT_LINES.search((DOCS / "agent.md").read_text())
    assert listing is not None, "docs/agent.md no longer lists the agent's log lines"
    for name in re.findall(rf"`({EVENT})`", PARENTHESES.sub("", listing[1])):
        yield "agent.md", name


def test_every_event_the_docs_name_is_logged() -> None:
    logged = logged_events()
    unlogged = {f"{doc}: {event}" for doc, event in quoted_events() if event not in logged}
    assert sorted(unlogged) == []


def test_the_rule_reads_the_docs_it_judges() -> None:
    """Not vacuous: the agent's list and the phrases elsewhere are found."""
    named = {event for _, event in quoted_events()}
    assert {"agent_started", "connected", "gpu_inventory_changed", "agent_stopping"} <= named
    assert {"engine_log_unreadable", "shard_record_not_removed"} <= named
    assert "engines_left_running" not in named  # a field of agent_stopping, not an event
