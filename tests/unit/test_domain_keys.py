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
from datetime import UTC, datetime, timedelta, timezone

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
from app.domain.operation_results import Change
from app.domain.state import ClusterState

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
"""When the decisions are asked: after every event of a test's log."""
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


def key_created(
    name: str, prefix: str, models: tuple[str, ...] = (), expires_at: datetime | None = None
) -> ApiKeyCreated:
    return ApiKeyCreated(
        key_id=f"k-{prefix}",
        name=name,
        prefix=prefix,
        secret_hash="h",
        models=models,
        expires_at=expires_at,
    )


def create(
    state: ClusterState,
    name: str = "ci",
    models: Sequence[str] = ("llama",),
    rpm: int | None = None,
    tpm: int | None = None,
    prefix: str = "0badc0de",
    expires_at: datetime | None = None,
    now: datetime = NOW,
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
        now=now,
        expires_at=expires_at,
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
    [
        "",
        "sk-abc",
        "llmgw-0badc0de",
        "llmgw-0BADC0DE-" + "s" * 43,
        "llmgw-0badc0d-" + "s" * 43,
        "llmgw-0badc0de-" + "s" * 43 + "\n",
    ],
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

    change = create(state, "ci", ["qwen", "llama"], rpm=60, tpm=100_000)

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
        (
            {"models": ["llama", "llama"]},
            "models",
            "'llama' is listed twice (models[0] and models[1]): list each model once",
        ),
        (
            {"models": ["*", "*"]},
            "models",
            "'*' is listed twice (models[0] and models[1]): list each model once",
        ),
        ({"rpm": 0}, "rpm", "must be between 1 and 2147483647 (or left out)"),
        ({"tpm": -5}, "tpm", "must be between 1 and 2147483647 (or left out)"),
        ({"tpm": 2**31}, "tpm", "must be between 1 and 2147483647 (or left out)"),
        ({"name": ""}, "name", "must be 1 to 64 letters"),
        ({"name": "ci pipeline"}, "name", "must be 1 to 64 letters"),
        ({"name": "x" * 65}, "name", "must be 1 to 64 letters"),
        ({"name": "ci\n"}, "name", "must be 1 to 64 letters"),
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


def test_each_model_listed_more_than_once_is_named_with_where() -> None:
    state = given(*declared("llama", "qwen"))

    with pytest.raises(keys.InvalidKey) as refused:
        create(state, models=["qwen", "llama", "qwen", "llama", "qwen"])

    assert [(e.field, e.reason) for e in refused.value.errors] == [
        (
            "models",
            "'qwen' is listed 3 times (models[0], models[2] and models[4]): list each model once",
        ),
        ("models", "'llama' is listed twice (models[1] and models[3]): list each model once"),
    ]


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


# -- expiring ----------------------------------------------------------------------------


def test_a_key_that_expires_records_when_in_utc_and_the_fold_keeps_it() -> None:
    state = given(*declared("llama"))
    at_nine_in_tokyo = datetime(2027, 1, 31, 9, 0, tzinfo=timezone(timedelta(hours=9)))

    [event] = create(state, expires_at=at_nine_in_tokyo).events
    key = given(*declared("llama"), event).keys["k-0badc0de"]

    assert isinstance(event, ApiKeyCreated)
    assert event.expires_at == datetime(2027, 1, 31, 0, 0, tzinfo=UTC)
    assert event.expires_at.tzinfo is UTC
    assert key.expires_at == datetime(2027, 1, 31, 0, 0, tzinfo=UTC)


def test_a_lifetime_is_counted_from_the_deciding_clock_not_the_client_s() -> None:
    """A client whose clock is two hours behind asks for an hour: the key works for an hour
    from when it is recorded, where a time it worked out itself would be an hour past."""
    state = given(*declared("llama"))

    [event] = keys.create(
        state,
        name="ci",
        models=("llama",),
        rpm=None,
        tpm=None,
        key_id="k-0badc0de",
        prefix="0badc0de",
        secret_hash="h",
        now=NOW,
        expires_in_s=3600.0,
    ).events

    assert isinstance(event, ApiKeyCreated)
    assert event.expires_at == NOW + timedelta(hours=1)


@pytest.mark.parametrize(
    ("lifetime_s", "expires_at", "reason"),
    [
        (0.0, None, "must be more than 0 and at most 10 years"),
        (-60.0, None, "must be more than 0 and at most 10 years"),
        (3654 * 86400.0, None, "must be more than 0 and at most 10 years"),
        (float("inf"), None, "must be more than 0 and at most 10 years"),
        (float("nan"), None, "must be more than 0 and at most 10 years"),
        (60.0, NOW + timedelta(days=1), "give expires_in_s or expires_at, not both"),
    ],
)
def test_a_lifetime_out_of_bounds_or_with_a_time_is_refused_naming_it(
    lifetime_s: float, expires_at: datetime | None, reason: str
) -> None:
    errors = keys.validate_key(
        given(*declared("llama")),
        "ci",
        ("llama",),
        None,
        None,
        expires_at=expires_at,
        expires_in_s=lifetime_s,
        now=NOW,
    )

    assert [(e.field, e.reason.startswith(reason)) for e in errors] == [("expires_in_s", True)]


def test_a_key_without_an_expiry_never_expires() -> None:
    [event] = create(given(*declared("llama"))).events
    key = given(*declared("llama"), event).keys["k-0badc0de"]

    assert isinstance(event, ApiKeyCreated)
    assert event.expires_at is None
    assert key.expires_at is None
    assert not key.expired(datetime.max.replace(tzinfo=UTC))
    assert key.live(datetime.max.replace(tzinfo=UTC))


def test_a_key_expires_at_its_time_by_the_clock_alone_with_no_event() -> None:
    ends = NOW + timedelta(minutes=90)
    state = given(key_created("contractor", "11111111", expires_at=ends))
    key = state.keys["k-11111111"]

    before = ends - timedelta(microseconds=1)
    assert (key.expired(before), key.live(before)) == (False, True)
    assert (key.expired(ends), key.live(ends)) == (True, False)
    assert key.revoked_at is None
    assert keys.live_keys(state, ends) == []


@pytest.mark.parametrize(
    ("expires_at", "reason"),
    [
        (
            datetime(2027, 1, 31),
            "must say its timezone: an RFC 3339 time with an offset, such as 2027-01-31T00:00:00Z",
        ),
        (NOW, "must be in the future (it is 2026-11-02 10:00:00 UTC now)"),
        (NOW - timedelta(days=1), "must be in the future (it is 2026-11-02 10:00:00 UTC now)"),
        (
            NOW + keys.MAX_LIFETIME + timedelta(microseconds=1),
            "must be at most 10 years ahead (2036-11-02 10:00:00 UTC), or left out for a key "
            "that never expires",
        ),
        (
            datetime(2099, 1, 1, tzinfo=UTC),
            "must be at most 10 years ahead (2036-11-02 10:00:00 UTC), or left out for a key "
            "that never expires",
        ),
    ],
)
def test_an_expiry_not_in_the_next_ten_years_or_without_a_timezone_is_refused(
    expires_at: datetime, reason: str
) -> None:
    with pytest.raises(keys.InvalidKey) as refused:
        create(given(*declared("llama")), expires_at=expires_at)

    assert [(e.field, e.reason) for e in refused.value.errors] == [("expires_at", reason)]


@pytest.mark.parametrize(
    "expires_at",
    [NOW + timedelta(microseconds=1), NOW + timedelta(days=30), NOW + keys.MAX_LIFETIME],
)
def test_an_expiry_up_to_ten_years_ahead_is_taken(expires_at: datetime) -> None:
    [event] = create(given(*declared("llama")), expires_at=expires_at).events

    assert isinstance(event, ApiKeyCreated)
    assert event.expires_at == expires_at


def test_an_expired_keys_name_may_be_given_to_a_new_key() -> None:
    state = given(*declared("llama"), key_created("ci", "11111111", expires_at=NOW))

    [event] = create(state, "ci", prefix="22222222").events

    assert isinstance(event, ApiKeyCreated)
    assert event.name == "ci"
    with pytest.raises(keys.DuplicateKeyName):
        create(state, "ci", prefix="22222222", now=NOW - timedelta(seconds=1))


def test_by_name_the_live_key_wins_over_expired_ones_and_with_none_live_it_is_ambiguous() -> None:
    state = given(
        key_created("ci", "11111111", expires_at=NOW - timedelta(hours=2)),
        key_created("ci", "22222222", expires_at=NOW - timedelta(hours=1)),
        key_created("ci", "33333333", expires_at=NOW + timedelta(hours=1)),
    )

    assert keys.find_key(state, "ci", NOW).prefix == "33333333"
    with pytest.raises(keys.AmbiguousKey, match=r"prefixes 22222222, 33333333\)"):
        keys.find_key(state, "ci", NOW - timedelta(minutes=90))
    # None live: any of the three may be the one meant, and each may still be revoked.
    with pytest.raises(
        keys.AmbiguousKey,
        match=r"^3 API keys named 'ci' have expired and are not revoked \(prefixes 11111111, "
        r"22222222, 33333333\); revoke one by its prefix$",
    ):
        keys.find_key(state, "ci", NOW + timedelta(hours=2))


def test_by_name_an_expired_key_not_yet_revoked_wins_over_revoked_ones() -> None:
    # The expired key ended first, the revoked one was revoked after: revoking by name
    # must not answer "already revoked" while a key of that name may still be revoked.
    state = given(
        key_created("ci", "11111111", expires_at=T0),
        key_created("ci", "22222222"),
        ApiKeyRevoked(key_id="k-22222222"),
    )

    found = keys.find_key(state, "ci", NOW)

    assert found.prefix == "11111111"
    assert keys.revoke(state, found.id).events == (
        ApiKeyRevoked(key_id="k-11111111", name="ci", prefix="11111111"),
    )
    again = given(
        key_created("ci", "11111111", expires_at=T0),
        key_created("ci", "22222222"),
        ApiKeyRevoked(key_id="k-22222222"),
        ApiKeyRevoked(key_id="k-11111111"),
    )
    assert keys.find_key(again, "ci", NOW).prefix == "11111111", "the one revoked last"


def test_an_expired_key_may_still_be_revoked() -> None:
    state = given(key_created("ci", "11111111", expires_at=NOW - timedelta(hours=1)))

    assert keys.revoke(state, "k-11111111").events == (
        ApiKeyRevoked(key_id="k-11111111", name="ci", prefix="11111111"),
    )


# -- revoking ----------------------------------------------------------------------------


def test_a_key_is_found_by_its_prefix_or_its_name() -> None:
    state = given(key_created("ci", "11111111"), key_created("bot", "22222222"))

    assert keys.find_key(state, "22222222", NOW).name == "bot"
    assert keys.find_key(state, "ci", NOW).prefix == "11111111"


def test_revoking_records_the_revocation_once() -> None:
    state = given(key_created("ci", "11111111"))

    first = keys.revoke(state, "k-11111111")
    again = keys.revoke(given(key_created("ci", "11111111"), *first.events), "k-11111111")

    assert first == Change(
        stream=key_stream("k-11111111"),
        events=(ApiKeyRevoked(key_id="k-11111111", name="ci", prefix="11111111"),),
    )
    assert again == Change(stream=key_stream("k-11111111"))


def test_a_name_whose_keys_are_all_revoked_finds_the_last_revoked_so_revoking_is_a_no_op() -> None:
    state = given(
        key_created("ci", "11111111"),
        ApiKeyRevoked(key_id="k-11111111"),
        key_created("ci", "22222222"),
        ApiKeyRevoked(key_id="k-22222222"),
    )

    found = keys.find_key(state, "ci", NOW)

    assert found.prefix == "22222222"
    assert keys.revoke(state, found.id).events == ()


def test_the_live_key_of_a_name_wins_over_revoked_ones() -> None:
    state = given(
        key_created("ci", "11111111"),
        ApiKeyRevoked(key_id="k-11111111"),
        key_created("ci", "22222222"),
    )

    assert keys.find_key(state, "ci", NOW).prefix == "22222222"


def test_a_name_shared_by_two_live_keys_must_be_revoked_by_prefix() -> None:
    # Two creations racing in two processes can both pass the name check.
    state = given(key_created("ci", "11111111"), key_created("ci", "22222222"))

    with pytest.raises(keys.AmbiguousKey, match=r"prefixes 11111111, 22222222\); revoke one"):
        keys.find_key(state, "ci", NOW)


def test_an_unknown_prefix_or_name_is_named() -> None:
    with pytest.raises(keys.UnknownKey, match=r"no API key \(by prefix or name\) 'nope'"):
        keys.find_key(given(key_created("ci", "11111111")), "nope", NOW)
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
    assert [k.name for k in keys.live_keys(state, NOW)] == ["a"]


def created_at(*seconds: int) -> ClusterState:
    """A key created ``seconds[n]`` after T0 for each n (several may share a second),
    recorded in that order, with prefixes that do not follow it."""
    return replay(
        [
            Recorded(
                position=n,
                stream=key_stream(f"k-{(7 * n) % 16:08x}"),
                version=1,
                event_id=uuid.uuid4(),
                recorded_at=T0 + timedelta(seconds=second),
                meta=Meta(actor="alice"),
                event=key_created(f"key-{n}", f"{(7 * n) % 16:08x}"),
            )
            for n, second in enumerate(seconds, start=1)
        ]
    )


@for_all(st.lists(st.integers(0, 3), max_size=12), st.integers(1, 5))
def test_pages_read_one_after_the_other_are_the_whole_list(seconds: list[int], size: int) -> None:
    state = created_at(*seconds)

    pages = [keys.listed(state, limit=size)]
    while len(pages[-1]) == size:
        pages.append(keys.listed(state, after=pages[-1][-1].id, limit=size))

    assert [key for page in pages for key in page] == keys.listed(state)
    assert all(len(page) <= size for page in pages)


def test_a_page_after_a_key_that_never_was_is_refused_naming_it() -> None:
    state = given(key_created("a", "11111111"))

    with pytest.raises(keys.UnknownPageStart, match=r"'k-99999999'"):
        keys.listed(state, after="k-99999999", limit=10)
    assert keys.listed(state, after="k-11111111") == []
