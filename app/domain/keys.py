"""API keys: their printed form, how they are hashed, and the decisions to create and revoke.

A key is printed once as ``llmgw-<prefix>-<secret>``. The prefix (8 hex characters) is
public: it identifies the key in lists, logs and the log. Only a SHA-256 of the whole key is
stored; the secret is 32 random bytes, so a fast hash is enough (there is nothing to guess
by brute force) and checking a key costs one hash and one constant-time compare.
"""

from __future__ import annotations

import hashlib
import hmac
import re

KEY_PREFIX = "llmgw-"
_KEY = re.compile(r"^llmgw-([0-9a-f]{8})-([A-Za-z0-9_-]{20,})$")


def format_key(prefix: str, secret: str) -> str:
    return f"{KEY_PREFIX}{prefix}-{secret}"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def prefix_of(key: str) -> str | None:
    """The public prefix of a presented key, or None when it is not an llmgw key at all."""
    match = _KEY.match(key)
    return match.group(1) if match else None


def key_matches(key: str, secret_hash: str) -> bool:
    """Whether ``key`` hashes to ``secret_hash``, compared in constant time."""
    return hmac.compare_digest(hash_key(key).encode(), secret_hash.encode())
