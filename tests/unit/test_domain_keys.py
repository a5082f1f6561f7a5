"""Stories of API keys: how one is printed and checked, and what creating or revoking one
records, or why it is refused.

Given the events already in the log, when an operator creates or revokes a key, then these
events (and only these) are recorded, or the request is refused with a reason an operator
can act on. Revoking a revoked key records nothing.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given as for_all
from hypothesis import strategies as st

from app.domain import keys
from app.domain.envelope import Meta, Recorded
from app.domain.events import (
    AnyEvent,
    ApiKeyCreated,
    ApiKeyRevoked,
    ModelDeclared,
    ModelRemoved,
    key_stream,
)
from app.domain.evolve import replay
from app.domain.model_spec import ModelSpec
from app.domain.operations import Change
from app.domain.state import ClusterState

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
COMMAND = "vllm serve {model} --port {port}"


def log(*events: AnyEvent) -> list[Recorded]:
    return [
        Recorded(
            position=n,
            stream="any",
            version=n,
            event_id=uuid.uuid4(),
            recorded_at=T0 + timedelta(seconds=n),
            meta=Meta(actor="alice"),
            event=event,
        )
        for n, event in enumerate(events, start=1)
    ]


def given(*events: AnyEvent) -> ClusterState:
    return replay(log(*events))


def declared(*names: str) -> list[AnyEvent]:
    return [ModelDeclared(model=n, spec=ModelSpec(name=n, command=COMMAND)) for n in names]


def key_created(name: str, prefix: str, models: tuple[str, ...] = ()) -> ApiKeyCreated:
    return ApiKeyCreated(
        key_id=f"k-{prefix}", name=name, prefix=prefix, secret_hash="h", models=models
    )


def create(
    state: ClusterState,
    name: str = "ci",
    models: Sequence[str] = ("llama",),
    rpm: int | None = None,
    tpm: int | None = None,
    prefix: str = "0badc0de",
) -> Change:
    return keys.create(
        state,
        name=name,
        models=models,
        rpm=rpm,
        tpm=tpm,
        key_id=f"k-{prefix}",
        prefix=prefix,
        secret_hash=keys.hash_key(keys.format_key(prefix, "s" * 43)),
    )


# -- the printed key ---------------------------------------------------------------------


def test_a_printed_key_gives_back_its_prefix_and_matches_only_its_own_hash() -> None:
    prefix, secret = secrets.token_hex(4), secrets.token_urlsafe(32)
    key = keys.format_key(prefix, secret)

    assert key == f"llmgw-{prefix}-{secret}"
    assert keys.prefix_of(key) == prefix
    assert keys.key_matches(key, keys.hash_key(key))
    assert not keys.key_matches(key[:-1] + ("A" if key[-1] != "A" else "B"), keys.hash_key(key))


@pytest.mark.parametrize(
    "presented",
    ["", "sk-abc", "llmgw-0badc0de", "llmgw-0BADC0DE-" + "s" * 43, "llmgw-0badc0d-" + "s" * 43],
)
def test_what_is_not_an_llmgw_key_has_no_prefix(presented: str) -> None:
    assert keys.prefix_of(presented) is None


@for_all(st.binary(min_size=4, max_size=4), st.binary(min_size=32, max_size=32))
def test_every_drawn_key_round_trips_its_prefix(prefix: bytes, secret: bytes) -> None:
    key = keys.format_key(prefix.hex(), secrets.token_urlsafe(32) + secret.hex())
    assert keys.prefix_of(key) == prefix.hex()


# -- creating ----------------------------------------------------------------------------


def test_a_key_is_recorded_in_its_own_stream_with_its_scope_and_limits() -> None:
    state = given(*declared("llama", "qwen"))

    change = create(state, "ci", ["qwen", "llama", "qwen"], rpm=60, tpm=100_000)

    assert change.stream == key_stream("k-0badc0de")
    [event] = change.events
    assert event == ApiKeyCreated(
        key_id="k-0badc0de",
        name="ci",
        prefix="0badc0de",
        secret_hash=keys.hash_key(keys.format_key("0badc0de", "s" * 43)),
        models=("llama", "qwen"),
        rpm=60,
        tpm=100_000,
    )


def test_a_star_scopes_the_key_to_every_model_even_with_none_declared() -> None:
    [event] = create(ClusterState(), models=["*"]).events

    assert isinstance(event, ApiKeyCreated)
    assert event.models == ()


def test_an_unknown_model_is_refused_naming_the_declared_ones() -> None:
    state = given(*declared("llama", "qwen", "gone"), ModelRemoved(model="gone"))

    with pytest.raises(keys.InvalidKey) as refused:
        create(state, models=["llama", "lama", "gone"])

    assert [(e.field, e.reason) for e in refused.value.errors] == [
        (
            "models",
            "'gone', 'lama' are not declared (declared models: llama, qwen; '*' for every model)",
        )
    ]
    assert "nothing was recorded" in str(refused.value)


def test_with_no_model_declared_the_refusal_says_so() -> None:
    with pytest.raises(keys.InvalidKey, match=r"declared models: none yet"):
        create(ClusterState(), models=["llama"])


@pytest.mark.parametrize(
    ("request_fields", "field", "reason"),
    [
        ({"models": []}, "models", "list at least one model, or '*' for every model"),
        ({"models": ["*", "llama"]}, "models", "'*' means every model: give it alone"),
        ({"rpm": 0}, "rpm", "must be between 1 and 2147483647 (or left out)"),
        ({"tpm": -5}, "tpm", "must be between 1 and 2147483647 (or left out)"),
        ({"tpm": 2**31}, "tpm", "must be between 1 and 2147483647 (or left out)"),
        ({"name": ""}, "name", "must be 1 to 64 letters"),
        ({"name": "ci pipeline"}, "name", "must be 1 to 64 letters"),
        ({"name": "x" * 65}, "name", "must be 1 to 64 letters"),
        ({"name": "deadbeef"}, "name", "must not look like a key prefix (8 hex characters)"),
    ],
)
def test_a_bad_request_is_refused_naming_the_field(
    request_fields: dict[str, object], field: str, reason: str
) -> None:
    state = given(*declared("llama"))
    arguments: dict[str, object] = {"name": "ci", "models": ["llama"]} | request_fields

    with pytest.raises(keys.InvalidKey) as refused:
        create(state, **arguments)  # type: ignore[arg-type]

    [error] = refused.value.errors
    assert error.field == field
    assert error.reason.startswith(reason)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(keys.InvalidKey) as refused:
        create(ClusterState(), name="-", models=[], rpm=0, tpm=0)

    assert [e.field for e in refused.value.errors] == ["name", "models", "rpm", "tpm"]


def test_a_live_keys_name_cannot_be_taken_but_a_revoked_ones_can() -> None:
    live = given(*declared("llama"), key_created("ci", "11111111"))
    revoked = given(
        *declared("llama"), key_created("ci", "11111111"), ApiKeyRevoked(key_id="k-11111111")
    )

    with pytest.raises(keys.DuplicateKeyName, match=r"already named 'ci' \(prefix 11111111\)"):
        create(live, "ci")
    assert len(create(revoked, "ci").events) == 1


def test_a_prefix_used_before_even_by_a_revoked_key_is_refused_so_another_is_drawn() -> None:
    state = given(
        *declared("llama"), key_created("old", "0badc0de"), ApiKeyRevoked(key_id="k-0badc0de")
    )

    with pytest.raises(keys.PrefixTaken):
        create(state, "new", prefix="0badc0de")


def test_a_malformed_prefix_is_a_bug_of_the_caller() -> None:
    with pytest.raises(ValueError, match="8 lowercase hex"):
        create(given(*declared("llama")), prefix="llmgw_7f3a")


# -- revoking ----------------------------------------------------------------------------


def test_a_key_is_found_by_its_prefix_or_its_name() -> None:
    state = given(key_created("ci", "11111111"), key_created("bot", "22222222"))

    assert keys.find_key(state, "22222222").name == "bot"
    assert keys.find_key(state, "ci").prefix == "11111111"


def test_revoking_records_the_revocation_once() -> None:
    state = given(key_created("ci", "11111111"))

    first = keys.revoke(state, "k-11111111")
    again = keys.revoke(given(key_created("ci", "11111111"), *first.events), "k-11111111")

    assert first == Change(
        stream=key_stream("k-11111111"), events=(ApiKeyRevoked(key_id="k-11111111"),)
    )
    assert again == Change(stream=key_stream("k-11111111"))


def test_a_name_whose_keys_are_all_revoked_finds_the_last_revoked_so_revoking_is_a_no_op() -> None:
    state = given(
        key_created("ci", "11111111"),
        ApiKeyRevoked(key_id="k-11111111"),
        key_created("ci", "22222222"),
        ApiKeyRevoked(key_id="k-22222222"),
    )

    found = keys.find_key(state, "ci")

    assert found.prefix == "22222222"
    assert keys.revoke(state, found.id).events == ()


def test_the_live_key_of_a_name_wins_over_revoked_ones() -> None:
    state = given(
        key_created("ci", "11111111"),
        ApiKeyRevoked(key_id="k-11111111"),
        key_created("ci", "22222222"),
    )

    assert keys.find_key(state, "ci").prefix == "22222222"


def test_a_name_shared_by_two_live_keys_must_be_revoked_by_prefix() -> None:
    # Two creations racing in two processes can both pass the name check.
    state = given(key_created("ci", "11111111"), key_created("ci", "22222222"))

    with pytest.raises(keys.AmbiguousKey, match=r"prefixes 11111111, 22222222\); revoke one"):
        keys.find_key(state, "ci")


def test_an_unknown_prefix_or_name_is_named() -> None:
    with pytest.raises(keys.UnknownKey, match=r"no API key \(by prefix or name\) 'nope'"):
        keys.find_key(given(key_created("ci", "11111111")), "nope")
    with pytest.raises(keys.UnknownKey):
        keys.revoke(ClusterState(), "k-11111111")


# -- listing -----------------------------------------------------------------------------


def test_the_list_holds_revoked_keys_too_oldest_first() -> None:
    state = given(
        key_created("b", "22222222"),
        key_created("a", "11111111"),
        ApiKeyRevoked(key_id="k-22222222"),
    )

    assert [k.name for k in keys.listed(state)] == ["b", "a"]
    assert [k.name for k in keys.live_keys(state)] == ["a"]
