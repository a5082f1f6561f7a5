"""`llmgw-cli model NAME` names the model's rollout under way, or how its last one ended,
whatever state the API gives it: every state the control plane has, and one this client
does not know yet, shown as the API spells it (its outcome only when it has one)."""

from __future__ import annotations

import pytest

from app.domain.state import UNDER_WAY, RolloutState
from cli.models import print_model
from cli.views import ModelRolloutView, ModelView


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wide enough that each fact is one line."""
    monkeypatch.setenv("COLUMNS", "200")


def rollout_line(capsys: pytest.CaptureFixture[str], rollout: ModelRolloutView) -> str:
    print_model(ModelView(name="llama", revision=3, rollout=rollout))
    lines = capsys.readouterr().out.splitlines()
    [line] = [line for line in lines if line.startswith(("rollout:", "last rollout:"))]
    # print_facts aligns the values; the line is compared with single spaces.
    line = " ".join(line.split())
    return line


@pytest.mark.parametrize("state", sorted(UNDER_WAY))
def test_a_rollout_under_way_shows_its_step(
    capsys: pytest.CaptureFixture[str], state: RolloutState
) -> None:
    rollout = ModelRolloutView(
        rollout_id="r-3", state=state.value, revision=3, from_revision=2, step=0, steps=2
    )
    assert rollout_line(capsys, rollout) == (
        f"rollout: r-3 {state.value.replace('_', ' ')}, revision 2 -> 3, step 1 of 2 "
        "(llmgw-cli rollout status llama)"
    )


@pytest.mark.parametrize("state", sorted(set(RolloutState) - UNDER_WAY))
def test_a_finished_rollout_shows_how_it_ended(
    capsys: pytest.CaptureFixture[str], state: RolloutState
) -> None:
    rollout = ModelRolloutView(rollout_id="r-3", state=state.value, outcome="as recorded")
    assert rollout_line(capsys, rollout) == (
        f"last rollout: r-3 {state.value.replace('_', ' ')}: as recorded"
    )


@pytest.mark.parametrize(
    ("state", "outcome", "shown"),
    [
        ("cancelled", None, "last rollout: r-3 cancelled"),
        ("abandoned", "", "last rollout: r-3 abandoned"),
        ("abandoned", "its model went away", "last rollout: r-3 abandoned: its model went away"),
    ],
)
def test_a_state_this_client_does_not_know_is_shown_as_the_api_spells_it(
    capsys: pytest.CaptureFixture[str], state: str, outcome: str | None, shown: str
) -> None:
    rollout = ModelRolloutView(rollout_id="r-3", state=state, outcome=outcome)
    assert rollout_line(capsys, rollout) == shown
