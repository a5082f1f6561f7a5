"""The gateway's key check: a key that verified is not hashed again while the snapshot
lasts, and a new snapshot (a key revoked) is checked afresh. A key's expiry comes in no
snapshot: it is checked against the clock on every request, the database's as the snapshot
found it from the gateway's."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

import pytest

from app.domain.keys import format_key, hash_key
from app.gateway import asgi
from app.gateway.asgi import KeyCheck, Scope
from app.gateway.errors import ApiError
from app.gateway.table import GatewaySnapshot, KeyRecord
from app.listeners.throttle import FailureBudget, FailureLimits

EXPIRES_AT = datetime(2027, 1, 31, 9, 30, tzinfo=UTC).timestamp()


def key_and_record(expires_at: float | None = None) -> tuple[str, KeyRecord]:
    prefix = secrets.token_hex(4)
    key = format_key(prefix, secrets.token_urlsafe(32))
    record = KeyRecord(
        key_id=prefix, name=prefix, prefix=prefix, secret_hash=hash_key(key), expires_at=expires_at
    )
    return key, record


class Clock:
    """A wall clock the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.read = 0

    def __call__(self) -> float:
        self.read += 1
        return self.now


def request(key: str) -> Scope:
    return {"headers": [(b"authorization", b"Bearer " + key.encode())], "client": ("127.0.0.9", 9)}


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys hashed for a check, in order."""
    hashed: list[str] = []
    matches = asgi.key_matches

    def counting(presented: str, secret_hash: str) -> bool:
        hashed.append(presented)
        return matches(presented, secret_hash)

    monkeypatch.setattr(asgi, "key_matches", counting)
    return hashed


def test_a_verified_key_is_hashed_once_per_snapshot(hashes: list[str]) -> None:
    key, record = key_and_record()
    snapshot = GatewaySnapshot(keys={record.prefix: record})
    check = KeyCheck()
    for _ in range(5):
        assert check.authenticate(snapshot, request(key)) is record
    assert hashes == [key]
    same_keys = GatewaySnapshot(keys={record.prefix: record})
    assert check.authenticate(same_keys, request(key)) is record
    assert hashes == [key, key]


def test_a_key_revoked_in_a_new_snapshot_is_refused_though_it_verified_before(
    hashes: list[str],
) -> None:
    key, record = key_and_record()
    check = KeyCheck()
    check.authenticate(GatewaySnapshot(keys={record.prefix: record}), request(key))
    with pytest.raises(ApiError) as refused:
        check.authenticate(GatewaySnapshot(), request(key))
    assert refused.value.status == 401


def test_a_wrong_key_is_checked_and_refused_every_time(hashes: list[str]) -> None:
    key, record = key_and_record()
    wrong = format_key(record.prefix, secrets.token_urlsafe(32))
    snapshot = GatewaySnapshot(keys={record.prefix: record})
    check = KeyCheck()
    for _ in range(3):
        with pytest.raises(ApiError):
            check.authenticate(snapshot, request(wrong))
    assert hashes == [wrong] * 3
    assert check.authenticate(snapshot, request(key)) is record


def test_a_key_is_served_until_its_expiry_then_refused_saying_when_though_it_verified_before(
    hashes: list[str],
) -> None:
    key, record = key_and_record(expires_at=EXPIRES_AT)
    snapshot = GatewaySnapshot(keys={record.prefix: record})
    clock = Clock(EXPIRES_AT - 0.001)
    check = KeyCheck(wall_clock=clock)

    assert check.authenticate(snapshot, request(key)) is record
    clock.now = EXPIRES_AT
    with pytest.raises(ApiError) as refused:
        check.authenticate(snapshot, request(key))

    assert hashes == [key]  # the same snapshot: refused without hashing the key again
    assert refused.value.status == 401
    assert refused.value.code == "invalid_api_key"
    assert refused.value.message == "This API key expired at 2027-01-31T09:30:00Z."
    assert b'"message":"This API key expired at 2027-01-31T09:30:00Z."' in refused.value.body()


@pytest.mark.parametrize("gateway_behind_s", [5.0, 120.0, 7200.0])
def test_a_gateway_whose_clock_is_behind_refuses_an_expired_key_on_the_database_s_time(
    gateway_behind_s: float,
) -> None:
    """Its own clock says the key has a second left; the database's, which the expiry was
    set by, says it ended a second ago."""
    key, record = key_and_record(expires_at=EXPIRES_AT)
    snapshot = GatewaySnapshot(keys={record.prefix: record}, clock_offset_s=gateway_behind_s)
    check = KeyCheck(wall_clock=Clock(EXPIRES_AT + 1 - gateway_behind_s))

    with pytest.raises(ApiError) as refused:
        check.authenticate(snapshot, request(key))
    assert refused.value.status == 401
    assert refused.value.message == "This API key expired at 2027-01-31T09:30:00Z."


@pytest.mark.parametrize("gateway_ahead_s", [5.0, 120.0, 7200.0])
def test_a_gateway_whose_clock_is_ahead_serves_a_key_until_the_database_s_time(
    gateway_ahead_s: float,
) -> None:
    key, record = key_and_record(expires_at=EXPIRES_AT)
    snapshot = GatewaySnapshot(keys={record.prefix: record}, clock_offset_s=-gateway_ahead_s)
    check = KeyCheck(wall_clock=Clock(EXPIRES_AT - 1 + gateway_ahead_s))

    assert check.authenticate(snapshot, request(key)) is record


def test_a_key_that_never_expires_costs_no_reading_of_the_clock() -> None:
    key, record = key_and_record()
    snapshot = GatewaySnapshot(keys={record.prefix: record})
    clock = Clock(EXPIRES_AT * 100)
    check = KeyCheck(wall_clock=clock)

    for _ in range(3):
        assert check.authenticate(snapshot, request(key)) is record

    assert clock.read == 0


def test_an_expired_key_spends_nothing_of_its_address_s_failures() -> None:
    key, record = key_and_record(expires_at=EXPIRES_AT)
    budget = FailureBudget(FailureLimits(burst=2, per_minute=1))
    check = KeyCheck(budget, wall_clock=Clock(EXPIRES_AT + 1))
    snapshot = GatewaySnapshot(keys={record.prefix: record})

    for _ in range(5):
        with pytest.raises(ApiError) as refused:
            check.authenticate(snapshot, request(key))
        assert refused.value.status == 401

    assert budget.wait_s("127.0.0.9") == 0


def twice(first: str, second: str) -> Scope:
    return {
        "headers": [
            (b"authorization", b"Bearer " + first.encode()),
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer " + second.encode()),
        ],
        "client": ("127.0.0.9", 9),
    }


@pytest.mark.parametrize("valid_first", [True, False])
def test_a_request_with_authorization_twice_is_a_400_that_checks_no_key_and_spends_nothing(
    hashes: list[str], valid_first: bool
) -> None:
    """Authorization is a singleton field (RFC 9110): a proxy in front may have checked
    either value, so the request is refused whichever one is valid. No key is checked, so
    nothing is learnt of either, and the address's failures are untouched."""
    key, record = key_and_record()
    wrong = format_key(record.prefix, secrets.token_urlsafe(32))
    budget = FailureBudget(FailureLimits(burst=1, per_minute=1))
    check = KeyCheck(budget)
    snapshot = GatewaySnapshot(keys={record.prefix: record})
    scope = twice(key, wrong) if valid_first else twice(wrong, key)

    for _ in range(3):
        with pytest.raises(ApiError) as refused:
            check.authenticate(snapshot, scope)
        assert refused.value.status == 400
        assert refused.value.type == "invalid_request_error"
        assert "Authorization header appears more than once" in refused.value.message

    assert hashes == []
    assert budget.wait_s("127.0.0.9") == 0


def test_a_key_once_verified_is_not_served_when_its_header_comes_twice(
    hashes: list[str],
) -> None:
    key, record = key_and_record()
    snapshot = GatewaySnapshot(keys={record.prefix: record})
    check = KeyCheck()
    assert check.authenticate(snapshot, request(key)) is record

    with pytest.raises(ApiError) as refused:
        check.authenticate(snapshot, twice(key, key))

    assert refused.value.status == 400


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param("{key}", id="the-key-alone"),
        pytest.param("Token {key}", id="another-scheme"),
        pytest.param("Basic Zm9vOmJhcg==", id="basic"),
    ],
)
def test_a_key_sent_without_the_bearer_scheme_is_told_so_and_spends_nothing(
    authorization: str, hashes: list[str]
) -> None:
    """A key pasted as the whole header is a common slip; "Missing API key" told its
    sender the key had not come at all."""
    key, record = key_and_record()
    failures = FailureBudget(FailureLimits(burst=1, per_minute=1))
    check = KeyCheck(failures=failures)
    scope: Scope = {
        "headers": [(b"authorization", authorization.format(key=key).encode())],
        "client": ("127.0.0.9", 9),
    }
    for _ in range(3):
        with pytest.raises(ApiError) as refused:
            check.authenticate(GatewaySnapshot(keys={record.prefix: record}), scope)
        assert (refused.value.status, refused.value.code) == (401, "invalid_api_key")
        assert "`Authorization: Bearer <key>`" in refused.value.message
        assert "not in the form" in refused.value.message
    assert hashes == []  # no key checked, so no failure spent: still 401, never 429
