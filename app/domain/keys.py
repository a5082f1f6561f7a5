"""API keys: their printed form, how they are hashed, and the decisions to create and revoke.

A key is printed once as ``llmgw-<prefix>-<secret>``. The prefix (8 hex characters) is
public: it identifies the key in lists, logs and the log. Only a SHA-256 of the whole key is
stored; the secret is 32 random bytes, so a fast hash is enough (there is nothing to guess
by brute force) and checking a key costs one hash and one constant-time compare.

A key may expire: ``expires_at`` is recorded when it is created, and from then on the
clock alone ends it (no event does). A request may give a lifetime instead
(``expires_in_s``), counted from ``now``, the clock of the control plane that records it:
a client whose own clock is off then gets the lifetime it asked for. Every decision that
asks whether a key is live is given ``now``; an expired key is as good as revoked, except
that revoking it still records the revocation.

The decisions refuse with these (``OperationError`` subclasses, so the admin API maps them
like the others)::

    InvalidKey          the request breaks a rule (``errors`` has each field and why)
    DuplicateKeyName    a live key (neither revoked nor expired) already has that name
    PrefixTaken         the prefix the caller drew is used already: draw another
    AmbiguousKey        a name shared by several live keys: revoke by prefix
    UnknownKey          no key has that id, prefix or name
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from app.domain.events import ApiKeyCreated, ApiKeyRevoked, key_stream
from app.domain.model_spec import SpecError
from app.domain.operation_results import (
    Change,
    InvalidFields,
    InvalidOperation,
    UnknownThing,
)
from app.domain.state import ApiKey, ClusterState

KEY_PREFIX = "llmgw-"
_KEY = re.compile(r"^llmgw-([0-9a-f]{8})-([A-Za-z0-9_-]{20,})$")


def format_key(prefix: str, secret: str) -> str:
    return f"{KEY_PREFIX}{prefix}-{secret}"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def prefix_of(key: str) -> str | None:
    """The public prefix of a presented key, or None when it is not an llmgw key at all."""
    match = _KEY.fullmatch(key)
    return match.group(1) if match else None


def key_matches(key: str, secret_hash: str) -> bool:
    """Whether ``key`` hashes to ``secret_hash``, compared in constant time."""
    return hmac.compare_digest(hash_key(key).encode(), secret_hash.encode())


# -- decisions ---------------------------------------------------------------------------

ALL_MODELS = "*"
"""In a request's model list: every model, now and later (recorded as an empty scope)."""
MAX_LIMIT = 2**31 - 1
"""The largest rpm or tpm: the ``api_keys`` columns are 32-bit integers."""
MAX_LIFETIME = timedelta(days=3653)
"""The furthest ahead a key may expire: ten years, leap days included."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_PREFIX = re.compile(r"^[0-9a-f]{8}$")


class InvalidKey(InvalidFields):
    def __init__(self, name: str, errors: Sequence[SpecError]) -> None:
        super().__init__(f"API key {name!r} cannot be created", errors)


class DuplicateKeyName(InvalidOperation):
    pass


class PrefixTaken(InvalidOperation):
    pass


class AmbiguousKey(InvalidOperation):
    pass


class UnknownKey(UnknownThing):
    kind = "API key (by prefix or name)"


class UnknownPageStart(UnknownKey):
    """A page of keys asked to start after a key id that names no key."""

    kind = "API key (by id) to list the keys after"


def create(
    state: ClusterState,
    *,
    name: str,
    models: Sequence[str],
    rpm: int | None,
    tpm: int | None,
    key_id: str,
    prefix: str,
    secret_hash: str,
    now: datetime,
    expires_at: datetime | None = None,
    expires_in_s: float | None = None,
) -> Change:
    """Record a new key scoped to ``models`` (``["*"]``: every model) that works until
    ``expires_at``, or for ``expires_in_s`` seconds from ``now`` (neither: until it is
    revoked). ``key_id``, ``prefix`` and ``secret_hash`` are drawn by the caller; a prefix
    already used, even by a revoked key, is refused with ``PrefixTaken`` so the caller draws
    again."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"a key prefix is 8 lowercase hex characters, not {prefix!r}")
    errors = validate_key(
        state, name, models, rpm, tpm, expires_at=expires_at, expires_in_s=expires_in_s, now=now
    )
    if errors:
        raise InvalidKey(name, errors)
    if expires_in_s is not None:
        expires_at = now + timedelta(seconds=expires_in_s)
    same_name = [k.prefix for k in live_keys(state, now) if k.name == name]
    if same_name:
        raise DuplicateKeyName(
            f"a live API key is already named {name!r} (prefix {same_name[0]}); revoke it "
            "first or choose another name"
        )
    if key_id in state.keys or any(k.prefix == prefix for k in state.keys.values()):
        raise PrefixTaken(f"key prefix {prefix} (id {key_id}) is taken")
    created = ApiKeyCreated(
        key_id=key_id,
        name=name,
        prefix=prefix,
        secret_hash=secret_hash,
        models=scope_of(models),
        rpm=rpm,
        tpm=tpm,
        expires_at=expires_at.astimezone(UTC) if expires_at is not None else None,
    )
    return Change(stream=key_stream(key_id), events=(created,))


def validate_key(
    state: ClusterState,
    name: str,
    models: Sequence[str],
    rpm: int | None,
    tpm: int | None,
    *,
    expires_at: datetime | None = None,
    expires_in_s: float | None = None,
    now: datetime,
) -> list[SpecError]:
    """Every problem with a key request (an empty list means it may be created)."""
    errors = []
    if not _NAME.fullmatch(name):
        errors.append(
            SpecError(
                "name",
                "must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            )
        )
    elif _PREFIX.fullmatch(name):
        errors.append(SpecError("name", "must not look like a key prefix (8 hex characters)"))
    errors.extend(_scope_errors(state, models))
    for field, limit in (("rpm", rpm), ("tpm", tpm)):
        if limit is not None and not 1 <= limit <= MAX_LIMIT:
            errors.append(SpecError(field, f"must be between 1 and {MAX_LIMIT} (or left out)"))
    if expires_at is not None and expires_in_s is not None:
        errors.append(SpecError("expires_in_s", "give expires_in_s or expires_at, not both"))
    elif expires_at is not None:
        errors.extend(_expiry_errors(expires_at, now))
    elif expires_in_s is not None and not 0 < expires_in_s <= MAX_LIFETIME.total_seconds():
        # NaN and infinities fail the comparison too.
        errors.append(
            SpecError(
                "expires_in_s",
                f"must be more than 0 and at most 10 years ({MAX_LIFETIME.total_seconds():.0f} "
                "seconds), or left out for a key that never expires",
            )
        )
    return errors


def _expiry_errors(expires_at: datetime, now: datetime) -> list[SpecError]:
    if expires_at.tzinfo is None or expires_at.utcoffset() is None:
        return [
            SpecError(
                "expires_at",
                "must say its timezone: an RFC 3339 time with an offset, such as "
                "2027-01-31T00:00:00Z",
            )
        ]
    if expires_at <= now:
        return [SpecError("expires_at", f"must be in the future (it is {utc_text(now)} now)")]
    if expires_at - now > MAX_LIFETIME:
        return [
            SpecError(
                "expires_at",
                f"must be at most 10 years ahead ({utc_text(now + MAX_LIFETIME)}), or left "
                "out for a key that never expires",
            )
        ]
    return []


def utc_text(at: datetime) -> str:
    """``2027-01-31 00:00:00 UTC``: a time as refusals and event lines write it."""
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _scope_errors(state: ClusterState, models: Sequence[str]) -> list[SpecError]:
    if not models:
        return [SpecError("models", f"list at least one model, or {ALL_MODELS!r} for every model")]
    repeated = repeated_models(models)
    if repeated:
        return [SpecError("models", reason) for reason in repeated]
    if ALL_MODELS in models:
        if len(set(models)) > 1:
            return [SpecError("models", f"{ALL_MODELS!r} means every model: give it alone")]
        return []
    declared = sorted(n for n, m in state.models.items() if not m.removed)
    unknown = sorted({m for m in models if m not in declared})
    if not unknown:
        return []
    listed = ", ".join(declared) if declared else "none yet"
    return [
        SpecError(
            "models",
            f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not "
            f"declared (declared models: {listed}; {ALL_MODELS!r} for every model)",
        )
    ]


def repeated_models(models: Sequence[str]) -> list[str]:
    """What is wrong with each model ``models`` names more than once, naming where
    (``'demo' is listed twice (models[0] and models[1])``). A key would be recorded with
    it once all the same; the request that named it twice most likely meant another model
    the second time, and the caller should learn it was not granted."""
    places: dict[str, list[int]] = {}
    for index, model in enumerate(models):
        places.setdefault(model, []).append(index)
    reasons = []
    for model, at in places.items():
        if len(at) > 1:
            times = "twice" if len(at) == 2 else f"{len(at)} times"
            where = [f"models[{index}]" for index in at]
            listed = f"{', '.join(where[:-1])} and {where[-1]}"
            reasons.append(f"{model!r} is listed {times} ({listed}): list each model once")
    return reasons


def scope_of(models: Sequence[str]) -> tuple[str, ...]:
    """The models a key is recorded with: sorted, once each; empty for every model."""
    return () if ALL_MODELS in models else tuple(sorted(set(models)))


def find_key(state: ClusterState, prefix_or_name: str, now: datetime) -> ApiKey:
    """The key with that id (``k-<prefix>``) or prefix; else the key of that name that an
    operator can mean: the live one (neither revoked nor expired at ``now``); with none
    live, the one not yet revoked (an expired key may still be revoked); with every key of
    that name revoked, the one revoked last (so revoking twice is no error). Several live
    keys of the name, or with none live several not revoked, are ``AmbiguousKey``."""
    if (by_id := state.keys.get(prefix_or_name)) is not None:
        return by_id
    for key in state.keys.values():
        if key.prefix == prefix_or_name:
            return key
    named = [k for k in state.keys.values() if k.name == prefix_or_name]
    live = [k for k in named if k.live(now)]
    meant = live or [k for k in named if k.revoked_at is None]
    if len(meant) > 1:
        prefixes = ", ".join(sorted(k.prefix for k in meant))
        which = (
            f"{len(meant)} live API keys are named {prefix_or_name!r}"
            if live
            else f"{len(meant)} API keys named {prefix_or_name!r} have expired and are not revoked"
        )
        raise AmbiguousKey(f"{which} (prefixes {prefixes}); revoke one by its prefix")
    if meant:
        return meant[0]
    if named:
        return max(named, key=lambda k: (k.revoked_at or k.created_at, k.created_at))
    raise UnknownKey(prefix_or_name)


def revoke(state: ClusterState, key_id: str) -> Change:
    """Revoke the key: nothing when it is revoked already."""
    key = state.keys.get(key_id)
    if key is None:
        raise UnknownKey(key_id)
    if key.revoked_at is not None:
        return Change(stream=key_stream(key_id))
    revoked = ApiKeyRevoked(key_id=key_id, name=key.name, prefix=key.prefix)
    return Change(stream=key_stream(key_id), events=(revoked,))


def same_name_created_since(created: Change, state: ClusterState, *, now: datetime) -> str | None:
    """Asked of the log a key's creation is appended on (the key in it): the stream of
    another live key of its name, created since the name was found free (by another
    control plane serving the admin API on the same log, whose creations this one does not
    wait for), else None: two live keys of one name would make the name useless."""
    for event in created.events:
        if isinstance(event, ApiKeyCreated):
            for key in live_keys(state, now):
                if key.name == event.name and key.id != event.key_id:
                    return key_stream(key.id)
    return None


def live_keys(state: ClusterState, now: datetime) -> list[ApiKey]:
    """The keys neither revoked nor expired at ``now``."""
    return [k for k in state.keys.values() if k.live(now)]


def listed(
    state: ClusterState, *, after: str | None = None, limit: int | None = None
) -> list[ApiKey]:
    """Every key ever created, revoked ones too, oldest first (by creation, then id); only
    those after the key whose id is ``after``, and at most ``limit``, when given. A key is
    never removed, so an ``after`` that names none is ``UnknownPageStart``."""
    keys = sorted(state.keys.values(), key=_listing_order)
    if after is not None:
        start = state.keys.get(after)
        if start is None:
            raise UnknownPageStart(after)
        keys = [key for key in keys if _listing_order(key) > _listing_order(start)]
    return keys if limit is None else keys[:limit]


def _listing_order(key: ApiKey) -> tuple[datetime, str]:
    return (key.created_at, key.id)
