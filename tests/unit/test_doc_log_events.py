"""Every log event the docs tell operators to look for is one the code logs, at the level
the docs give: a renamed or never-written event, or one logged at another level, would leave
a filter on it matching nothing, silently. Read off the docs' wording ("logs `x`", "logged
as `x`", "the warning `x`", "the log's `x`", "`x` (warning, ...)", the agent's list of its
lines, the lines operations.md says to watch) and off the source, with test_log_events'
reading of the log calls."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from tests.unit.test_log_events import PACKAGES, ROOT, leveled_log_calls, log_calls

DOCS = ROOT / "docs"
SNAKE = r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+"
EVENT = r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*"
NAMED_AS_LOGGED = re.compile(
    rf"(?:\blogs|\blogged (?:once )?as|\blogging|\bthe warning|\bwarns|\blog line)\s+`({SNAKE})`"
    rf"|\bthe log's `({SNAKE})` names"
)
LEVEL_GIVEN = re.compile(rf"`({SNAKE})` \((?:an? )?(debug|info|warning|error)\b")
"""An event followed by the level the docs give it: "`stream_cut_off` (warning, ...)"."""
WATCHED_LINES = re.compile(r"^- \*\*Logs\*\* \(\[below\]\(#logs\)\):(.*?)^- ", re.DOTALL | re.M)
"""operations.md's "What to watch" list of log lines."""
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
            yield doc.name, match[1] or match[2]
    # The agent's list of its lines; the fields some carry are in parentheses.
    listing = AGENT_LINES.search((DOCS / "agent.md").read_text())
    assert listing is not None, "docs/agent.md no longer lists the agent's log lines"
    for name in re.findall(rf"`({EVENT})`", PARENTHESES.sub("", listing[1])):
        yield "agent.md", name
    watched = WATCHED_LINES.search((DOCS / "operations.md").read_text())
    assert watched is not None, "docs/operations.md no longer lists the log lines to watch"
    for name in re.findall(rf"`({SNAKE})`", PARENTHESES.sub("", watched[1])):
        yield "operations.md", name


def logged_levels() -> dict[str, set[str | None]]:
    """The levels each event is logged at (None: worked out when it is logged)."""
    levels: dict[str, set[str | None]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for _, level, event in leveled_log_calls(path):
                if isinstance(event, ast.Constant) and isinstance(event.value, str):
                    levels.setdefault(event.value, set()).add(level)
    return levels


def given_levels() -> Iterator[tuple[str, str, str]]:
    """(doc, event, level) for every level a doc gives a logged event; a level given to a
    name the code does not log (an event of the event log, such as `shard_failed`) is not
    a log line's."""
    for doc in sorted(DOCS.glob("*.md")):
        text = re.sub(r"\s+", " ", doc.read_text())
        for match in LEVEL_GIVEN.finditer(text):
            yield doc.name, match[1], match[2]


def test_every_event_the_docs_name_is_logged() -> None:
    logged = logged_events()
    unlogged = {f"{doc}: {event}" for doc, event in quoted_events() if event not in logged}
    assert sorted(unlogged) == []


def test_each_event_is_logged_at_the_level_the_docs_give() -> None:
    levels = logged_levels()
    elsewhere = {
        f"{doc}: {event} is said to be {level}, logged at {sorted(map(str, levels[event]))}"
        for doc, event, level in given_levels()
        if event in levels and not {level, None} & levels[event]
    }
    assert sorted(elsewhere) == []


def test_the_rule_reads_the_docs_it_judges() -> None:
    """Not vacuous: the agent's list and the phrases elsewhere are found."""
    named = {event for _, event in quoted_events()}
    assert {"agent_started", "connected", "gpu_inventory_changed", "agent_stopping"} <= named
    assert {"engine_log_unreadable", "shard_record_not_removed"} <= named
    assert "engines_left_running" not in named  # a field of agent_stopping, not an event
    assert {"agent_certificate_refused", "cannot_connect", "gpu_xid"} <= named
    given = {(event, level) for _, event, level in given_levels()}
    assert {("stream_cut_off", "warning"), ("gateway_id_shared", "error")} <= given
    assert logged_levels()["stream_cut_off"] == {"warning"}
