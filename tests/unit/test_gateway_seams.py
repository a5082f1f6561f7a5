"""The gateway's modules meet at named interfaces, never at each other's private members.

A module of ``app.gateway`` that reaches into ``_something`` of an object whose class
another module defines (``router._capacity_freed(...)``, ``await answer._head``), or that
imports another module's ``_name``, ties itself to what that module is free to change. The
seam gets a public name or a ``Protocol`` in the module that uses it instead. That holds
for ``self`` too: a class that subclasses another module's class to call its private
members (``self._admit`` of a base class elsewhere) is bound to all of it; what the two
share is a collaborator with a public interface (``ExchangeSteps``, which ``Completions``
and ``Uploads`` both hold).

Read from the source, as the layer rules are: a member counts as a module's own when a
class of that module defines it (a method, a slot, an assignment to ``self._name``). A
failure lists every access with its line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "app" / "gateway"


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_members(tree: ast.Module) -> set[str]:
    """The private members the classes of a module define."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(inner.name)
            elif isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store):
                if isinstance(inner.value, ast.Name) and inner.value.id in ("self", "cls"):
                    names.add(inner.attr)
            elif isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                names.add(inner.id)
            elif isinstance(inner, ast.Constant) and isinstance(inner.value, str):
                names.add(inner.value)  # ``__slots__``
    return {name for name in names if private(name)}


def seams(
    path: Path, trees: dict[Path, ast.Module], members: dict[Path, set[str]] | None = None
) -> Iterator[str]:
    """Each private member of another module's class that ``path`` uses, with its line
    (``members``: each module's ``own_members``, when the caller has them already)."""
    members = members if members is not None else {p: own_members(t) for p, t in trees.items()}
    own = members[path]
    elsewhere = set().union(*(names for other, names in members.items() if other != path))
    where = path.relative_to(ROOT)
    for node in sorted(ast.walk(trees[path]), key=lambda node: getattr(node, "lineno", 0)):
        if isinstance(node, ast.Attribute) and private(node.attr):
            if node.attr in elsewhere and node.attr not in own:
                yield f"{where}:{node.lineno}: {ast.unparse(node)}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("app.gateway"):
            for alias in node.names:
                if private(alias.name):
                    yield f"{where}:{node.lineno}: from {node.module} import {alias.name}"


def test_no_gateway_module_reaches_into_another_modules_private_members() -> None:
    paths = sorted(GATEWAY.glob("*.py"))
    trees = {path: ast.parse(path.read_text(), filename=str(path)) for path in paths}
    members = {path: own_members(tree) for path, tree in trees.items()}
    found = [seam for path in paths for seam in seams(path, trees, members)]
    assert found == [], "\n".join(found)


def test_a_seam_is_seen() -> None:
    """The rule itself: a private member of another module's class is found, read or set;
    the module's own and its ``self``'s are not."""
    lease = GATEWAY / "lease.py"
    router = GATEWAY / "router.py"
    trees = {
        lease: ast.parse(
            "class Lease:\n"
            "    def release(self):\n"
            "        self._open = False\n"
            "        self._router._capacity_freed(self._replica)\n"
            "        other._open = True\n"
            "        answer._capacity_freed = None\n"
        ),
        router: ast.parse(
            "from app.gateway.lease import _Unlisted\n"
            "class Router:\n"
            "    def _capacity_freed(self, state):\n"
            "        self._retired = {}\n"
        ),
    }
    assert list(seams(lease, trees)) == [
        "app/gateway/lease.py:4: self._router._capacity_freed",
        "app/gateway/lease.py:6: answer._capacity_freed",
    ]
    assert list(seams(router, trees)) == [
        "app/gateway/router.py:1: from app.gateway.lease import _Unlisted"
    ]


def test_a_subclass_reaching_into_its_base_classes_private_members_is_seen() -> None:
    completions = GATEWAY / "completions.py"
    uploads = GATEWAY / "uploads.py"
    trees = {
        completions: ast.parse("class Completions:\n    async def _admit(self):\n        pass\n"),
        uploads: ast.parse(
            "from app.gateway.completions import Completions\n"
            "class Uploads(Completions):\n"
            "    async def serve(self):\n"
            "        await self._admit()\n"
            "        self._limit = 1\n"
        ),
    }
    assert list(seams(uploads, trees)) == ["app/gateway/uploads.py:4: self._admit"]
