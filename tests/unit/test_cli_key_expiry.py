"""`llmgw-cli keys create --expires-in/--expires-at`: what the operator typed is read as a
span with a unit or a time with its timezone, and one outside the next ten years, or both
flags at once, is bad usage (exit 2, one line) before anything is sent: the admin URL here
has nobody listening, so a request would fail differently (exit 1)."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta, timezone
from typing import ClassVar

import pytest
from cyclopts import Token

from cli.arguments import ArgumentRefused, UsageError, duration, moment
from cli.config import ConnectionFlags
from cli.keys import MAX_LIFETIME, create_key, expiry
from devcluster.processes import program
from tests.support.ports import free_port
from tests.support.stub_admin import StubHandler, stub_admin_api

CLI = program("llmgw-cli")
NOW = datetime(2026, 12, 4, 17, 0, tzinfo=UTC)
CREATE = ("keys", "create", "--name", "demo", "--models", "*")


def run_cli(*argv: str) -> tuple[int, str, str]:
    environment = os.environ | {
        "COLUMNS": "200",
        "TERM": "dumb",
        "LLMGW_ADMIN_URL": f"http://127.0.0.1:{free_port()}",
    }
    done = subprocess.run(
        [CLI, *argv], capture_output=True, text=True, env=environment, timeout=60, check=False
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize(
    ("text", "span"),
    [
        ("90m", timedelta(minutes=90)),
        ("12h", timedelta(hours=12)),
        ("30d", timedelta(days=30)),
        ("2w", timedelta(weeks=2)),
        ("45s", timedelta(seconds=45)),
        (" 1d ", timedelta(days=1)),
    ],
)
def test_a_span_is_a_whole_number_and_a_unit(text: str, span: timedelta) -> None:
    assert duration(timedelta, [Token(value=text)]) == span


@pytest.mark.parametrize("text", ["30", "d", "1.5h", "-1d", "30 d", "30D", "1y", "P30D", ""])
def test_anything_else_is_not_a_span(text: str) -> None:
    with pytest.raises(ArgumentRefused, match=r"^must be a whole number and a unit \(s, m, h"):
        duration(timedelta, [Token(value=text)])


def test_a_span_past_what_a_time_can_hold_is_refused_not_a_traceback() -> None:
    with pytest.raises(ArgumentRefused, match=r"^is too long, got 99999999999w$"):
        duration(timedelta, [Token(value="99999999999w")])


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("2027-01-31T00:00:00Z", datetime(2027, 1, 31, tzinfo=UTC)),
        (
            "2027-01-31T09:00:00+09:00",
            datetime(2027, 1, 31, 9, tzinfo=timezone(timedelta(hours=9))),
        ),
        ("2027-01-31 00:00:00.5+00:00", datetime(2027, 1, 31, 0, 0, 0, 500_000, tzinfo=UTC)),
    ],
)
def test_a_time_is_iso_8601_with_its_timezone(text: str, at: datetime) -> None:
    assert moment(datetime, [Token(value=text)]) == at


@pytest.mark.parametrize("text", ["2027-01-31T00:00:00", "2027-01-31"])
def test_a_time_without_a_timezone_is_refused(text: str) -> None:
    with pytest.raises(ArgumentRefused, match=r"^must say its timezone \(such as Z or \+02:00"):
        moment(datetime, [Token(value=text)])


def test_what_is_no_time_at_all_is_refused() -> None:
    with pytest.raises(ArgumentRefused, match=r"^must be an ISO 8601 time such as 2027-01-31T"):
        moment(datetime, [Token(value="next tuesday")])


def test_the_expiry_is_now_plus_the_span_or_the_time_given_or_none() -> None:
    at = datetime(2027, 1, 31, tzinfo=UTC)

    assert expiry(timedelta(days=30), None, NOW) == NOW + timedelta(days=30)
    assert expiry(None, at, NOW) == at
    assert expiry(MAX_LIFETIME, None, NOW) == NOW + MAX_LIFETIME
    assert expiry(None, None, NOW) is None


@pytest.mark.parametrize(
    ("expires_in", "expires_at", "refusal"),
    [
        (timedelta(days=1), NOW + timedelta(days=1), "give --expires-in or --expires-at, not both"),
        (timedelta(0), None, "--expires-in must be longer than 0"),
        (MAX_LIFETIME + timedelta(seconds=1), None, "--expires-in must be at most 10 years"),
        (
            None,
            NOW,
            "--expires-at 2026-12-04T17:00:00+00:00 is not in the future (it is "
            "2026-12-04 17:00:00 UTC now)",
        ),
        (
            None,
            NOW + MAX_LIFETIME + timedelta(seconds=1),
            "--expires-at 2036-12-04T17:00:01+00:00 is more than 10 years ahead (at most "
            "2036-12-04 17:00:00 UTC)",
        ),
    ],
)
def test_both_flags_or_an_expiry_outside_the_next_ten_years_is_bad_usage(
    expires_in: timedelta | None, expires_at: datetime | None, refusal: str
) -> None:
    with pytest.raises(UsageError) as refused:
        expiry(expires_in, expires_at, NOW)

    assert str(refused.value).startswith(refusal)


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ("--expires-in", "30d", "--expires-at", "2027-01-31T00:00:00Z"),
            "give --expires-in or --expires-at, not both",
        ),
        (
            ("--expires-in", "30"),
            "--expires-in must be a whole number and a unit (s, m, h, d or w), such as 90m, "
            "12h, 30d or 2w, got 30",
        ),
        (
            ("--expires-at", "2027-01-31T00:00:00"),
            "--expires-at must say its timezone (such as Z or +02:00 at the end), got "
            "2027-01-31T00:00:00",
        ),
        (("--expires-in", "522w"), "--expires-in must be at most 10 years (3653d)"),
        (("--expires-in", "0h"), "--expires-in must be longer than 0"),
    ],
)
def test_bad_expiry_flags_exit_2_with_one_line(flags: tuple[str, ...], line: str) -> None:
    assert run_cli(*CREATE, *flags) == (2, "", f"llmgw-cli keys create: {line}\n")


def test_an_expiry_in_the_past_exits_2_saying_the_time_now() -> None:
    code, stdout, stderr = run_cli(*CREATE, "--expires-at", "2020-01-01T00:00:00Z")

    assert (code, stdout) == (2, "")
    assert stderr.startswith(
        "llmgw-cli keys create: --expires-at 2020-01-01T00:00:00+00:00 is not in the future (it is "
    )


class CreatingKeys(StubHandler):
    """Notes each body it is sent and answers as the admin API would for the key."""

    bodies: ClassVar[list[dict[str, object]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.bodies.append(body)
        created = {
            "id": "k-0badc0de",
            "prefix": "0badc0de",
            "name": body["name"],
            "models": body["models"],
            "rpm": None,
            "tpm": None,
            "created_at": "2026-12-04T17:00:00Z",
            "created_by": "alice",
            "revoked": False,
            "revoked_at": None,
            "revoked_by": None,
            "expires_at": "2026-12-04T18:00:00Z",
            "expired": False,
            "key": "llmgw-0badc0de-" + "s" * 43,
        }
        self.answer(201, "application/json", json.dumps(created).encode())


@pytest.mark.parametrize(
    ("span", "seconds"), [(timedelta(hours=1), 3600.0), (timedelta(days=30), 2_592_000.0)]
)
def test_a_span_is_sent_as_a_span_for_the_server_s_clock_to_count(
    span: timedelta, seconds: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A time worked out by this machine's clock would be off by as much as the clock is:
    one two hours behind would ask for an hour and be refused for a time in the past."""
    CreatingKeys.bodies = []
    with stub_admin_api(CreatingKeys, monkeypatch) as url:
        code = create_key(
            name="ci", models="demo", expires_in=span, connection=ConnectionFlags(admin_url=url)
        )

    assert code == 0
    [body] = CreatingKeys.bodies
    assert body.get("expires_in_s") == seconds
    assert "expires_at" not in body


def test_a_time_is_sent_as_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
    CreatingKeys.bodies = []
    with stub_admin_api(CreatingKeys, monkeypatch) as url:
        code = create_key(
            name="ci", models="demo", expires_at=at, connection=ConnectionFlags(admin_url=url)
        )

    assert code == 0
    [body] = CreatingKeys.bodies
    assert datetime.fromisoformat(str(body["expires_at"])) == at
    assert "expires_in_s" not in body
