"""The gateway's key check: a key that verified is not hashed again while the snapshot
lasts, and a new snapshot (a key revoked) is checked afresh."""

from __future__ import annotations

import secrets

import pytest

from app.domain.keys import format_key, hash_key
from app.gateway import asgi
from app.gateway.asgi import KeyCheck, Scope
from app.gateway.errors import ApiError
from app.gateway.table import GatewaySnapshot, KeyRecord


def key_and_record() -> tuple[str, KeyRecord]:
    prefix = secrets.token_hex(4)
    key = format_key(prefix, secrets.token_urlsafe(32))
    record = KeyRecord(key_id=prefix, name=prefix, prefix=prefix, secret_hash=hash_key(key))
    return key, record


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
