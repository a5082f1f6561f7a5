"""How `models apply --dry-run` words the server's preview of each spec."""

from __future__ import annotations

import pytest

from cli.models import report_previews
from cli.operator import Reply
from cli.views import ApplyPreview, SpecFieldChange


def shown(preview: ApplyPreview, capsys: pytest.CaptureFixture[str]) -> str:
    report_previews([Reply(preview, b"{}")], "table")
    return capsys.readouterr().out


def test_a_new_revision_names_its_rollout_each_change_and_what_changes_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    preview = ApplyPreview(
        model="llama",
        outcome="new_revision",
        revision=3,
        from_revision=2,
        revision_changes=[SpecFieldChange(field="env.HF_TOKEN", old=None, new="(set)")],
        at_once=[SpecFieldChange(field="replicas", old="4", new="6")],
        rollout_id="rollout-llama-r3",
    )

    assert shown(preview, capsys).splitlines() == [
        "model llama: would be revision 3 (now 2): a rollout (rollout-llama-r3) replaces its "
        "replicas with it",
        "  env.HF_TOKEN: (none) -> (set)",
        "  at once: replicas: 4 -> 6",
        "dry run: nothing was recorded",
    ]


def test_an_outcome_this_client_does_not_know_is_shown_as_the_server_said_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Never read as a template: braces in it are text, not fields to fill in."""
    preview = ApplyPreview(model="llama", outcome="{revision.__class__} {x}")

    assert shown(preview, capsys).splitlines()[0] == "model llama: {revision.__class__} {x}"


def test_a_rollout_under_way_that_the_new_one_would_supersede_is_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    preview = ApplyPreview(
        model="llama",
        outcome="new_revision",
        revision=3,
        from_revision=2,
        rollout_id="rollout-llama-r3",
        supersedes="rollout-llama-r2",
    )

    assert (
        shown(preview, capsys)
        .splitlines()[0]
        .endswith(
            "(rollout-llama-r3) replaces its replicas with it; it supersedes rollout-llama-r2, "
            "under way now"
        )
    )
