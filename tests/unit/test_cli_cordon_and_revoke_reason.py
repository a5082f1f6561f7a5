"""`llmgw-cli cordon NODE --reason '...'` and `llmgw-cli cert revoke --reason '...'` refuse a
reason the admin API would refuse (over 500 characters, or holding a control character) as
bad usage (exit 2), naming what was wrong, and send nothing; a reason the API takes is sent.
The API strips a revocation's reason before it checks it, and so does the CLI."""

from __future__ import annotations

import pytest

from app.domain.free_text import reason_errors
from app.domain.revocations import InvalidRevocation, RevocationRequest, checked
from cli.main import app
from tests.support.stub_admin import RecordingAdmin


def revocation_refused(reason: str) -> bool:
    try:
        checked(RevocationRequest(serial="5f1c0a9e3b", reason=reason))
    except InvalidRevocation:
        return True
    return False


COMMANDS = {
    "cordon": (["cordon", "gpu-1"], "POST /admin/v1/nodes/gpu-1/cordon"),
    "cert revoke": (
        ["cert", "revoke", "--serial", "5f1c0a9e3b"],
        "POST /admin/v1/certificates/revocations",
    ),
}
REFUSED = [
    ("x" * 501, "--reason must be at most 500 characters, got 501"),
    (
        "ECC\x1b[2J errors",
        "--reason must be one line of text, got the control character U+001B (character 4)",
    ),
    ("two\nlines", "--reason must be one line of text, got the control character U+000A"),
    ("nul\0", "--reason must be one line of text, got the control character U+0000"),
    ("del\x7f", "--reason must be one line of text, got the control character U+007F"),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("reason", "refusal"), REFUSED)
def test_a_reason_the_api_refuses_is_bad_usage_and_nothing_is_sent(
    recording_admin: RecordingAdmin,
    capsys: pytest.CaptureFixture[str],
    command: str,
    reason: str,
    refusal: str,
) -> None:
    # Before, it was sent, refused by the API with a 400, and the command exited 1.
    assert reason_errors("reason", reason), "the API refuses it for a cordon"
    assert revocation_refused(reason), "and for a revocation"
    argv, _ = COMMANDS[command]

    with pytest.raises(SystemExit) as ended:
        app([*argv, "--reason", reason, "--admin-url", recording_admin.url])

    error = capsys.readouterr().err
    assert (ended.value.code, recording_admin.sent) == (2, []), error
    assert error.startswith(f"llmgw-cli {command}: ")
    assert refusal in error
    assert "\x1b" not in error


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("reason", ["x" * 500, "ECC errors on GPU 3"])
def test_a_reason_the_api_takes_is_sent(
    recording_admin: RecordingAdmin, command: str, reason: str
) -> None:
    assert not reason_errors("reason", reason)
    assert not revocation_refused(reason)
    argv, request = COMMANDS[command]

    with pytest.raises(SystemExit) as ended:
        app([*argv, "--reason", reason, "--admin-url", recording_admin.url])

    assert ended.value.code == 1  # the stub refuses it: what matters is that it was asked
    assert list(recording_admin.sent) == [request]


@pytest.mark.parametrize("reason", ["x" * 500 + "  ", "machine rebuilt\n"])
def test_a_revocation_reason_is_checked_as_the_api_checks_it_once_stripped(
    recording_admin: RecordingAdmin, reason: str
) -> None:
    assert not revocation_refused(reason)

    with pytest.raises(SystemExit) as ended:
        app(
            [
                "cert",
                "revoke",
                "--serial",
                "5f1c0a9e3b",
                "--reason",
                reason,
                "--admin-url",
                recording_admin.url,
            ]
        )

    assert ended.value.code == 1
    assert recording_admin.sent == ["POST /admin/v1/certificates/revocations"]


def test_an_empty_cordon_reason_is_still_sent(recording_admin: RecordingAdmin) -> None:
    with pytest.raises(SystemExit) as ended:
        app(["cordon", "gpu-1", "--admin-url", recording_admin.url])

    assert ended.value.code == 1
    assert recording_admin.sent == ["POST /admin/v1/nodes/gpu-1/cordon"]
