"""Which nodes a spec's ``node_selector`` may match, and its checks."""

from __future__ import annotations

from app.domain.spec_error import SpecError

MAX_SELECTOR_LABELS = 64
MAX_LABEL_KEY_CHARS = 63
MAX_LABEL_VALUE_CHARS = 256
"""A node's labels, as its agent may report them (``wire.messages.Labels``, kept equal by a
test): a selector beyond them could never match a node."""


def node_selector_errors(selector: dict[str, str]) -> list[SpecError]:
    """A selector some node could match: within the labels an agent may report."""
    could_not = "so no node could match"
    if len(selector) > MAX_SELECTOR_LABELS:
        reason = f"has {len(selector)} labels: a node has at most {MAX_SELECTOR_LABELS}"
        return [SpecError("node_selector", f"{reason}, {could_not}")]
    errors = []
    for key, value in selector.items():
        if not 1 <= len(key) <= MAX_LABEL_KEY_CHARS:
            errors.append(
                SpecError(
                    "node_selector",
                    f"holds the key {key[:80]!r}: a node's label keys are "
                    f"1-{MAX_LABEL_KEY_CHARS} characters, {could_not}",
                )
            )
        elif len(value) > MAX_LABEL_VALUE_CHARS:
            errors.append(
                SpecError(
                    f"node_selector.{key}",
                    f"is {len(value)} characters: a node's label values are at most "
                    f"{MAX_LABEL_VALUE_CHARS}, {could_not}",
                )
            )
    return errors
