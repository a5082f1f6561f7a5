"""docs/reconciler.md numbers the rules of ``reconcile.decide`` once: its list of the rules,
its table of modules, ``reconcile``'s docstring and each rule module's docstring agree."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from app.domain import reconcile

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reconciler.md"
LISTED = re.compile(r"^(\d+)\. \*\*", re.M)
RULES_SECTION = re.compile(r"^## The rules of `decide`\n(?P<rules>.*?)^## ", re.DOTALL | re.M)
MODULE_ROW = re.compile(
    r"^\| `app/domain/(?P<module>\w+)\.py` \| (?P<rule>rules? [\d-]+)(?:, in part)?:", re.M
)


def code_rules() -> dict[int, str]:
    """``reconcile``'s docstring's list of the rules, by number."""
    found = re.search(r"The rules, in order:\n\n(.*?)\n\n", reconcile.__doc__ or "", re.DOTALL)
    assert found, "reconcile's docstring has no list of the rules"
    entries = re.split(r"^(\d+)\. ", found[1], flags=re.M)
    return {int(n): text for n, text in zip(entries[1::2], entries[2::2], strict=True)}


def page_rules() -> list[int]:
    found = RULES_SECTION.search(PAGE.read_text())
    assert found, f"{PAGE} has no section 'The rules of `decide`'"
    return [int(n) for n in LISTED.findall(found["rules"])]


def test_the_rules_are_listed_in_order_and_as_many_as_decide_has() -> None:
    listed = page_rules()

    assert listed == list(range(1, len(listed) + 1))
    assert list(code_rules()) == listed, "reconcile's docstring numbers the rules as the page"


def test_each_rule_module_in_the_table_is_the_rule_its_docstring_says() -> None:
    rows = MODULE_ROW.findall(PAGE.read_text())
    in_code = code_rules()

    assert len(rows) >= 4, rows
    for module, rule in rows:
        last = int(re.findall(r"\d+", rule)[-1])
        assert f"``{module}``" in in_code.get(last, ""), (
            f"docs/reconciler.md gives app/domain/{module}.py {rule}; reconcile's docstring "
            f"names it elsewhere"
        )
        doc = importlib.import_module(f"app.domain.{module}").__doc__ or ""
        assert re.match(rf"(Part of )?{rule} of ``reconcile\.decide``", doc, re.I), (
            f"docs/reconciler.md gives app/domain/{module}.py {rule}; its docstring begins "
            f"{doc[:60]!r}"
        )
