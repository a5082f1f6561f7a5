"""A key creation whose answer was lost: sent again, the admin API answers 409
``carried-out-already`` naming the key the first request created, whose secret only the
lost answer held. llmgw-cli revokes that key and creates another
(tests/integration/test_cli_answer_lost.py runs it against the real admin API); these are
the ways that can stop short, and an answer it must not act on."""

from __future__ import annotations

import httpx
import pytest

from cli.client import AdminClient, ApiProblem, ClientError
from cli.config import ConnectionSettings
from cli.key_requests import create_key

SETTINGS = ConnectionSettings(admin_url="http://admin.invalid:8081")


def carried_out_already(key_id: object) -> httpx.Response:
    return httpx.Response(
        409,
        json={"title": "carried-out-already", "detail": "carried out before", "key_id": key_id},
    )


def test_a_lost_key_whose_revocation_is_refused_is_named_with_how_to_revoke_it() -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if request.method == "DELETE":
            return httpx.Response(503, json={"title": "not-leader", "detail": "not the leader"})
        if len(sent) == 1:
            raise httpx.ReadError("", request=request)
        return carried_out_already("k-0badf00d")

    with (
        AdminClient(SETTINGS, transport=httpx.MockTransport(answer)) as client,
        pytest.raises(ClientError) as raised,
    ):
        create_key(client, "ci", ["*"])

    assert [(r.method, r.url.path) for r in sent] == [
        ("POST", "/admin/v1/keys"),
        ("POST", "/admin/v1/keys"),
        ("DELETE", "/admin/v1/keys/k-0badf00d"),
    ]
    assert str(raised.value) == (
        "key k-0badf00d was created but its secret was lost with the answer, and revoking "
        "it failed: not the leader. Revoke it (`llmgw-cli keys revoke k-0badf00d`) and "
        "create another"
    )


@pytest.mark.parametrize("key_id", [None, 7, "", " ", "k-\n1", "k" * 129])
def test_a_carried_out_answer_naming_no_usable_key_revokes_nothing(key_id: object) -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return carried_out_already(key_id)

    with (
        AdminClient(SETTINGS, transport=httpx.MockTransport(answer)) as client,
        pytest.raises(ApiProblem) as raised,
    ):
        create_key(client, "ci", ["*"])

    assert [r.method for r in sent] == ["POST"]
    assert raised.value.status == 409
