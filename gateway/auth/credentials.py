"""API keys and principals.

An API key reads `dgk_<key id>_<secret>`: the prefix lets secret scanners find leaked
keys, the key id finds the stored record without a scan, and only a SHA-256 of the
whole key is stored (the secret carries 256 bits, so a fast hash is enough; a slow
password hash would only cost latency). Comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

API_KEY_PREFIX = "dgk_"
# outcomes:train: attach outcomes that train catalog adapters (a write to an entry's
# behaviour, more than deciding).
SCOPES = ("chat", "decide", "catalogs:read", "catalogs:write", "outcomes:train", "admin")
_API_KEY = re.compile(r"^dgk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: str
    scopes: frozenset[str]
    models: frozenset[str] | None  # None: every model
    credential_id: str  # the key id, token id or IAM principal, for logs and records (never the secret)
    expires_at: float | None = None  # when the credential stops being valid
    iam: bool = False  # authenticated by SigV4 (IAM), not by a bearer credential
    kind: str = "api_key"  # "api_key", "token" or "iam": what the revocation check looks up
    issued_at: float | None = None  # tokens: when minted ("not before" times refuse earlier ones)
    subject: str = ""  # tokens: the IAM principal that minted it
    key_id: str = ""  # tokens: the signing key

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


@dataclass(frozen=True, slots=True)
class NewApiKey:
    key_id: str
    secret: str  # the whole key, shown once to whoever created it

    def __repr__(self) -> str:  # never print the secret by accident
        return f"NewApiKey(key_id={self.key_id!r}, secret='***')"


def new_api_key() -> NewApiKey:
    key_id = secrets.token_hex(8)
    return NewApiKey(key_id, f"{API_KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}")


def api_key_id(candidate: str) -> str | None:
    """The key id of a well-formed API key, else None (no store read for garbage)."""
    match = _API_KEY.match(candidate)
    return match.group(1) if match else None


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def same_hash(candidate_key: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_api_key(candidate_key), stored_hash)


def bearer_credential(header: str | None) -> str | None:
    """The credential of an `Authorization: Bearer ...` header, else None."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
