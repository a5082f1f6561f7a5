"""The import layers DESIGN.md and STYLE.md describe, enforced by reading every import.

    cli ──> (app.pki, app.logs,            never app.domain: the CLI renders what the API says
             app.usage_errors)
    agent ──> wire, app.pki, app.logs,     the agent speaks the wire, not the server's mind
              app.regular_file,            (app.logs, app.regular_file, app.usage_errors and
              app.usage_errors,            app.usage_words: the plumbing every program shares)
              app.usage_words
    app.admin, app.gateway, app.hub, app.store, app.bootstrap   the shell and adapters
      └──> app.services ──> app.domain <── (only the standard library and msgspec)
    app.store ─x─> app.gateway             the store knows no reader of it
    app.services ─x─> app.hub, app.store.postgres   services know their adapters by protocol
    app ─x─> agent, cli                    the server is not built of the other programs
    app, agent, cli, wire ─x─> devcluster  the dev cluster drives the programs; none needs it

Each rule names the modules that break it; a failure lists every offending import with
its line, so it says what to move rather than only that something is wrong.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "agent", "cli", "wire")
STANDARD_LIBRARY = frozenset(sys.stdlib_module_names)


def modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue  # Alembic revisions run in Alembic's environment
            yield ".".join(path.relative_to(ROOT).with_suffix("").parts), path


def imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """``(line, imported module)`` for every import, relative ones resolved."""
    package = module.split(".")[: -1 if path.name != "__init__.py" else None]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                yield node.lineno, ".".join([*base, *([node.module] if node.module else [])])
            elif node.module:
                yield node.lineno, node.module


@functools.cache
def every_import() -> tuple[tuple[str, Path, int, str], ...]:
    """``(module, path, line, imported module)`` for every import of every module: read
    once, judged by each rule."""
    return tuple(
        (module, path, line, imported)
        for module, path in modules()
        for line, imported in imports(module, path)
    )


def within(name: str, *prefixes: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def domain_rule(module: str, imported: str) -> bool:
    if not within(module, "app.domain"):
        return False
    top = imported.split(".")[0]
    if top in STANDARD_LIBRARY or top in {"msgspec", "__future__"}:
        return False
    return not within(imported, "app.domain")


RULES = {
    "app.domain imports only the standard library, msgspec and itself": domain_rule,
    "app imports neither agent nor cli": lambda module, imported: (
        within(module, "app") and within(imported, "agent", "cli")
    ),
    "app.store imports nothing of app.gateway": lambda module, imported: (
        within(module, "app.store") and within(imported, "app.gateway")
    ),
    "app.services import neither the agent hub nor the PostgreSQL store": lambda module, imported: (
        within(module, "app.services") and within(imported, "app.hub", "app.store.postgres")
    ),
    "no program imports the dev cluster": lambda module, imported: within(imported, "devcluster"),
    "cli imports nothing of app.domain": lambda module, imported: (
        within(module, "cli") and within(imported, "app.domain")
    ),
    "agent imports of app only app.pki, app.logs, app.regular_file and app.usage_*": (
        lambda module, imported: (
            within(module, "agent")
            and within(imported, "app")
            and not within(
                imported,
                "app.pki",
                "app.logs",
                "app.regular_file",
                "app.usage_errors",
                "app.usage_words",
            )
        )
    ),
    "wire imports nothing of app, agent or cli": lambda module, imported: (
        within(module, "wire") and within(imported, "app", "agent", "cli")
    ),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_imports_keep_to_the_layers(rule: str) -> None:
    breaks = RULES[rule]
    offending = [
        f"{path.relative_to(ROOT)}:{line} imports {imported}"
        for module, path, line, imported in every_import()
        if breaks(module, imported)
    ]
    assert offending == [], f"{rule}:\n" + "\n".join(offending)


def test_the_rules_see_a_breach() -> None:
    """The rules are not vacuous: each names a breach it would find."""
    assert domain_rule("app.domain.events", "sqlalchemy")
    assert not domain_rule("app.domain.events", "app.domain.state")
    assert RULES["app.services import neither the agent hub nor the PostgreSQL store"](
        "app.services.reconciler", "app.hub.hub"
    )
    assert RULES["cli imports nothing of app.domain"]("cli.keys", "app.domain.keys")
    assert not RULES["cli imports nothing of app.domain"]("cli.keys", "app.pki")
    assert RULES["no program imports the dev cluster"]("app.commands.serve", "devcluster.dev")
    agent_rule = RULES[
        "agent imports of app only app.pki, app.logs, app.regular_file and app.usage_*"
    ]
    assert agent_rule("agent.main", "app.bootstrap")
    assert not agent_rule("agent.main", "app.usage_errors")
    assert not agent_rule("agent.simulator.serve", "app.usage_words")
