"""``models apply`` of a new revision names the replicas that keep running the one before
until the rollout replaces them, in a sentence that agrees with how many there are."""

from __future__ import annotations

import pytest

from cli.models import report_applied
from cli.operator import Reply
from cli.views import ModelChange, ModelView


def applied(outdated: list[str]) -> Reply[ModelChange]:
    model = ModelView(name="llama", revision=2, outdated=outdated)
    return Reply(value=ModelChange(changed=True, model=model), raw=b"{}")


@pytest.mark.parametrize(
    ("outdated", "line"),
    [
        (["llama-1"], "  1 replica placed with another revision keeps running it"),
        (["llama-1", "llama-2"], "  2 replicas placed with another revision keep running it"),
    ],
)
def test_the_replicas_left_at_the_revision_before_are_told_in_agreement(
    capsys: pytest.CaptureFixture[str], outdated: list[str], line: str
) -> None:
    report_applied([applied(outdated)], "table")

    told = capsys.readouterr().out.splitlines()
    assert told[0] == "model llama: declared, revision 2"
    assert told[1] == f"{line} until replaced: {', '.join(outdated)}"
