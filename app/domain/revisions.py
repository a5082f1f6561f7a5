"""Revisions of a model: which changes of a spec change what runs, and what changed.

A model's spec has two kinds of fields. Those in ``REVISION_FIELDS`` decide the engine
process a replica runs and where it may run: its command, environment and engine, the GPUs
of a shard and how much memory each must have free, how many shards a replica spans, and
which nodes may host it. Changing any of them makes a new **revision** of the model: a
replica placed before the change keeps running the revision it was placed with, until it is
replaced. Every other field takes effect at once for every replica, and is no revision: the
replica count, the routing settings (the gateway's, not the engine's), the startup timeout,
the stop grace and the number of moves at a time (the control plane's timers and pace).

The first declaration of a model is revision 1. Events recorded before revisions existed
carry none and read as revision 1, every one of them: so a replay of an old log, a fold
started from a snapshot, and the projection rows migrated in place all say the same.
"""

from __future__ import annotations

import msgspec

from app.domain.model_spec import ModelSpec
from app.domain.spec_secrets import withhold_secrets

FIRST_REVISION = 1

REVISION_FIELDS = (
    "command",
    "engine",
    "env",
    "gpus_per_shard",
    "gpu_memory_gib",
    "shards_per_replica",
    "node_selector",
)
"""The fields of a spec whose change is a new revision (see the module docstring)."""

WITHHELD = "(set)"
"""What a change of an environment variable says of its value, which may be a secret."""

_SHOWN_CHARS = 48


class SpecChange(msgspec.Struct, frozen=True, kw_only=True):
    """One field a revision changed, with its values before and after as text. An
    environment variable is a field of its own, ``env.NAME``, whose values are never
    written: ``old`` None means it was added, ``new`` None that it was removed, and
    ``WITHHELD`` stands for a value."""

    field: str
    old: str | None = None
    new: str | None = None


def spec_changes(old: ModelSpec, new: ModelSpec) -> tuple[SpecChange, ...]:
    """What differs between ``old`` and ``new`` in ``REVISION_FIELDS``, in that order
    (environment variables by name); empty when ``new`` is the same revision."""
    changes: list[SpecChange] = []
    for field in REVISION_FIELDS:
        before, after = getattr(old, field), getattr(new, field)
        if before == after:
            continue
        if field == "env":
            changes.extend(_env_changes(old.env, new.env))
        elif field == "command":
            # A command recorded before secrets were refused in one may hold a key.
            shown_before, _ = withhold_secrets(before, {})
            shown_after, _ = withhold_secrets(after, {})
            changes.append(SpecChange(field=field, old=_text(shown_before), new=_text(shown_after)))
        else:
            changes.append(SpecChange(field=field, old=_text(before), new=_text(after)))
    return tuple(changes)


def at_once_changes(old: ModelSpec, new: ModelSpec) -> tuple[SpecChange, ...]:
    """What differs between ``old`` and ``new`` outside ``REVISION_FIELDS``: the changes
    that take effect at once, each nested setting a field of its own (``routing.weight``,
    ``autoscale.max``); an unset setting has no value (``old`` or ``new`` None)."""
    before, after = _settings(old), _settings(new)
    return tuple(
        SpecChange(field=key, old=before.get(key), new=after.get(key))
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    )


def _settings(spec: ModelSpec) -> dict[str, str]:
    flat: dict[str, str] = {}
    for field in msgspec.structs.fields(ModelSpec):
        if field.name != "name" and field.name not in REVISION_FIELDS:
            _flatten(field.name, msgspec.to_builtins(getattr(spec, field.name)), flat)
    return flat


def _flatten(key: str, value: object, into: dict[str, str]) -> None:
    if isinstance(value, dict):
        for name, inner in value.items():
            _flatten(f"{key}.{name}", inner, into)
    elif isinstance(value, list | tuple):
        # to_builtins keeps a tuple a tuple (``apis``, ``rollout.steps``): JSON, as the
        # spec writes it, not Python's repr.
        into[key] = msgspec.json.encode(value).decode()
    elif value is not None:
        into[key] = _text(value)


def next_revision(latest: int, changes: tuple[SpecChange, ...]) -> int:
    """The revision a declaration with ``changes`` makes, after the ``latest`` the model
    ever had (a rolled back one included, so that no number means two specs)."""
    return latest + 1 if changes else latest


def rollout_id_for(model: str, revision: int) -> str:
    """A rollout's id, its correlation id in the log: one rollout brings each revision in."""
    return f"rollout-{model}-r{revision}"


def describe_changes(changes: tuple[SpecChange, ...]) -> str:
    """The changes in one line: ``command 'a' -> 'b'; env: added HF_TOKEN, changed DEBUG``."""
    said: list[str] = []
    env: dict[str, list[str]] = {}
    for change in changes:
        if change.field.startswith("env."):
            how = "added" if change.old is None else "removed" if change.new is None else "changed"
            env.setdefault(how, []).append(change.field.removeprefix("env."))
            continue
        before, after = change.old, change.new
        if change.field == "command":  # recorded by an older release, it may hold a key
            before = None if before is None else withhold_secrets(before, {})[0]
            after = None if after is None else withhold_secrets(after, {})[0]
        old, new = _from_where_they_differ(before, after)
        said.append(f"{change.field} {_shown(old)} -> {_shown(new)}")
    if env:
        parts = (f"{how} {', '.join(names)}" for how, names in sorted(env.items()))
        said.append("env: " + "; ".join(parts))
    return "; ".join(said)


def _env_changes(old: dict[str, str], new: dict[str, str]) -> list[SpecChange]:
    return [
        SpecChange(
            field=f"env.{name}",
            old=WITHHELD if name in old else None,
            new=WITHHELD if name in new else None,
        )
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]


def _text(value: object) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _from_where_they_differ(old: str | None, new: str | None) -> tuple[str | None, str | None]:
    """Two values too long to show whole, alike at their start (a long engine command with
    one flag changed at its end), from the word before the one where they part: cut at the
    same place, both would read the same and hide the change."""
    if old is None or new is None or max(len(old), len(new)) <= _SHOWN_CHARS:
        return old, new
    alike = (a == b for a, b in zip(old, new, strict=False))
    parted = next((i for i, same in enumerate(alike) if not same), min(len(old), len(new)))
    word = old.rfind(" ", 0, parted)
    start = old.rfind(" ", 0, max(word, 0)) + 1
    if start == 0:
        return old, new
    return "..." + old[start:], "..." + new[start:]


def _shown(value: str | None) -> str:
    if value is None or value == "":
        return "(none)"
    if len(value) > _SHOWN_CHARS:
        value = value[: _SHOWN_CHARS - 3] + "..."
    return repr(value) if " " in value or not value.isprintable() else value
