"""Identifiers: `<prefix>_<26 lowercase Crockford base32>`, as the seed's patterns require."""

from __future__ import annotations

import hashlib
import secrets

from ulid import ULID

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def new_id(prefix: str) -> str:
    """A time-ordered id, so keyset pagination by id follows creation order."""
    return f"{prefix}_{str(ULID()).lower()}"


def derived_id(prefix: str, *parts: str) -> str:
    """A stable id from a hash of `parts` (idempotency keys): 26 base32 characters."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    number = int.from_bytes(digest[:17], "big") >> 6  # 130 bits = 26 characters
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[number & 31])
        number >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


def new_token() -> str:
    return f"bct_{secrets.token_urlsafe(32)}"


def token_hash(token: str) -> str:
    # Tokens carry 256 random bits, so a plain SHA-256 is as strong as a slow KDF here.
    return hashlib.sha256(token.encode()).hexdigest()
