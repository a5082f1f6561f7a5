"""A spec as the admin API shows it: the secrets a spec recorded before they were refused
may hold (``app.domain.spec_secrets``) withheld, the log left as it is."""

from __future__ import annotations

from typing import Any

from app.domain.spec_secrets import withhold_secrets


def shown_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` (a spec as builtins) with a secret-looking variable's value and a
    secret-looking flag's value replaced by ``(withheld)``."""
    command, env = withhold_secrets(spec.get("command", ""), spec.get("env", {}))
    return {**spec, "command": command, "env": env}


def shown_change(change: Any) -> Any:
    """A revision's change of the command (``SpecChange`` as builtins) with its values'
    secrets withheld; any other change as it is (a variable's values never are shown)."""
    if not isinstance(change, dict) or change.get("field") != "command":
        return change
    shown = dict(change)
    for side in ("old", "new"):
        if isinstance(shown.get(side), str):
            shown[side], _ = withhold_secrets(shown[side], {})
    return shown
