"""llmgw-cli facing the admin API of an older release, as while a fleet is upgraded: a
path, a method or a body field the server does not know is told as that, in one line
naming what was sent, never as a bare ``Not Found`` an operator reads as "no such drain".

The answers are the ones llmgw 41d815f (schema revision 0013) gave, word for word."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.client import AdminClient, ApiProblem, ClientError
from cli.config import ConnectionFlags, ConnectionSettings
from cli.drain import drain_progress
from cli.drain_cancel import drain_cancel
from tests.support.stub_admin import StubHandler, stub_admin_api
from wire.version import llmgw_version

PROBLEM = "application/problem+json"
OLD_NOT_FOUND = (
    b'{"type":"https://llmgw.dev/problems/not-found","title":"not-found","status":404,'
    b'"detail":"Not Found"}'
)
OLD_METHOD_NOT_ALLOWED = (
    b'{"type":"https://llmgw.dev/problems/method-not-allowed","title":"method-not-allowed",'
    b'"status":405,"detail":"Method Not Allowed"}'
)
OLD_UNKNOWN_FIELD = (
    b'{"type":"https://llmgw.dev/problems/validation","title":"validation","status":400,'
    b'"detail":"(body): Object contains unknown field `expires_at`","errors":[{"key":'
    b'"(body)","message":"Object contains unknown field `expires_at`","source":"body"}]}'
)
OLD_UNKNOWN_DRAIN = (
    b'{"type":"https://llmgw.dev/problems/unknown-drain","title":"unknown-drain","status":404,'
    b'"detail":"no drain \'drain-5c2e81d0\' is known","id":"drain-5c2e81d0"}'
)
OLDER = "it runs an older llmgw release than this llmgw-cli"


class OlderRelease(StubHandler):
    """No drain cancellation, no PATCH of a model's autoscaling, no key expiry yet; drains
    it does not know are told apart."""

    def do_POST(self) -> None:
        if self.path == "/admin/v1/keys":
            self.answer(400, PROBLEM, OLD_UNKNOWN_FIELD)
        else:
            self.answer(404, PROBLEM, OLD_NOT_FOUND)

    def do_PATCH(self) -> None:
        self.answer(405, PROBLEM, OLD_METHOD_NOT_ALLOWED)

    def do_GET(self) -> None:
        self.answer(404, PROBLEM, OLD_UNKNOWN_DRAIN)


@pytest.fixture
def admin_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with stub_admin_api(OlderRelease, monkeypatch) as url:
        yield url


def test_a_command_the_server_has_no_path_for_says_the_server_is_older(
    admin_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = drain_cancel("drain-5c2e81d0", connection=ConnectionFlags(admin_url=admin_url))

    assert code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"llmgw-cli drain-cancel: the admin API at {admin_url} does not know POST "
        f"/admin/v1/drains/drain-5c2e81d0/cancel (Not Found): {OLDER} ({llmgw_version()}); "
        "upgrade the control planes first (docs/operations.md#upgrades), or use the "
        "llmgw-cli of the server's release"
    ]


@pytest.mark.parametrize(
    ("method", "path", "body", "said"),
    [
        ("PATCH", "/admin/v1/models/demo/autoscale", {"min": 1}, "Method Not Allowed"),
        (
            "POST",
            "/admin/v1/keys",
            {"name": "ci", "models": ["demo"], "expires_at": "2027-01-01T00:00:00Z"},
            "(body): Object contains unknown field `expires_at`",
        ),
    ],
)
def test_a_method_or_a_field_the_server_lacks_says_the_server_is_older(
    admin_url: str, method: str, path: str, body: object, said: str
) -> None:
    with (
        AdminClient(ConnectionSettings(admin_url=admin_url)) as client,
        pytest.raises(ClientError) as raised,
    ):
        client.request(method, path, body=body)

    assert str(raised.value).startswith(
        f"the admin API at {admin_url} does not know {method} {path} ({said}): {OLDER} "
    )


def test_a_thing_the_server_does_not_know_is_still_told_as_that(
    admin_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with (
        AdminClient(ConnectionSettings(admin_url=admin_url)) as client,
        pytest.raises(ApiProblem) as raised,
    ):
        client.request("GET", "/admin/v1/drains/drain-5c2e81d0")
    code = drain_progress("drain-5c2e81d0", connection=ConnectionFlags(admin_url=admin_url))

    assert (raised.value.status, str(raised.value)) == (404, "no drain 'drain-5c2e81d0' is known")
    assert code == 1
    assert OLDER not in capsys.readouterr().err
