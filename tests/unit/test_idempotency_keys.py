"""Idempotency keys as the domain reads them: which keys are usable, and the event ids a
key gives a change (``app.domain.idempotency``)."""

from __future__ import annotations

import pytest

from app.domain.idempotency import event_ids, key_problem, request_digest, unquoted


@pytest.mark.parametrize(
    "sent", ["8e03978e-40d5-43e8-bc93-6894a57f9324", '"8e03978e"', "a" * 128, "b64+/=="]
)
def test_a_uuid_or_random_token_is_a_usable_key(sent: str) -> None:
    assert key_problem(sent) is None


@pytest.mark.parametrize("sent", ["", '""', "a b", "a" * 129, "ключ", "a\x00b", '"a'])
def test_a_malformed_key_is_told_what_a_key_is(sent: str) -> None:
    problem = key_problem(sent)

    assert problem is not None
    assert "1 to 128 characters of letters, digits" in problem


def test_the_quoted_form_of_the_draft_is_the_same_key_as_the_bare_one() -> None:
    assert unquoted('"k-1"') == unquoted("k-1") == "k-1"


def test_each_actor_and_key_gives_a_change_ids_of_its_own() -> None:
    alice = event_ids("alice", "k", 3)

    assert alice == event_ids("alice", "k", 3)
    assert len(set(alice)) == 3
    assert event_ids("alice", "k", 1) == alice[:1]
    assert not set(alice) & set(event_ids("bob", "k", 3))
    assert not set(alice) & set(event_ids("alice", "k2", 3))
    assert not set(event_ids("a:k", "x", 1)) & set(event_ids("a", "k:x", 1))


def test_a_request_differs_from_another_in_method_target_or_body() -> None:
    scale = request_digest("POST", b"/admin/v1/models/m/scale", b'{"replicas":3}')

    assert scale == request_digest("post", b"/admin/v1/models/m/scale", b'{"replicas":3}')
    assert scale != request_digest("POST", b"/admin/v1/models/m/scale", b'{"replicas":5}')
    assert scale != request_digest("PUT", b"/admin/v1/models/m/scale", b'{"replicas":3}')
    assert scale != request_digest("POST", b"/admin/v1/models/n/scale", b'{"replicas":3}')
