"""Short-lived bearer tokens, signed with HMAC-SHA256 by a key from a key ring.

    dgt_<base64url(claims JSON)>.<base64url(HMAC-SHA256(key[kid], "dgt_" + claims))>

The claims name the key id (`kid`) they were signed with, so keys rotate without
breaking live tokens: a new key becomes current for minting, the old one still
verifies until its tokens expire. They carry a token id (`jti`) for revocation, the
tenant, scopes, models and expiry, so verifying needs no store read. The prefix lets
secret scanners find leaked tokens. The TTL is capped at 12 hours.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

TOKEN_PREFIX = "dgt_"  # noqa: S105 (a prefix, not a secret)
DEFAULT_TTL_S = 3600
MAX_TTL_S = 12 * 3600
MIN_TTL_S = 60
MAX_TOKEN_CHARS = 4096


class TokenError(Exception):
    """The token is malformed, forged, signed by an unknown key or expired (one message for all)."""


class KeyRing(Protocol):
    def current(self) -> tuple[str, bytes]:
        """The key id and key that sign new tokens."""
        ...

    def keys(self, reload: bool = False) -> dict[str, bytes]:
        """Every key that may still verify tokens, by id; `reload` asks for a fresh read
        (a rotation may have added one), which the ring may decline if it read recently."""
        ...


@dataclass(frozen=True, slots=True)
class TokenClaims:
    token_id: str
    tenant_id: str
    scopes: tuple[str, ...]
    models: tuple[str, ...] | None
    issued_at: int
    expires_at: int
    key_id: str
    subject: str = ""  # the IAM principal that minted it (per-principal "not before"); "" in older tokens


def mint(ring: KeyRing, tenant_id: str, scopes: tuple[str, ...], models: tuple[str, ...] | None, ttl_s: int,
         now: float, subject: str = "") -> tuple[str, TokenClaims]:
    if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise ValueError(f"ttl_s must be between {MIN_TTL_S} and {MAX_TTL_S}")
    key_id, key = ring.current()
    claims = TokenClaims(secrets.token_hex(16), tenant_id, tuple(sorted(scopes)),
                         None if models is None else tuple(sorted(models)), int(now), int(now) + ttl_s, key_id, subject)
    document = {"v": 1, "kid": key_id, "jti": claims.token_id, "ten": tenant_id, "scp": list(claims.scopes),
                "mdl": None if claims.models is None else list(claims.models), "iat": claims.issued_at, "exp": claims.expires_at,
                "sub": subject}
    payload = _b64(json.dumps(document, separators=(",", ":"), sort_keys=True).encode())
    return f"{TOKEN_PREFIX}{payload}.{_b64(_sign(key, payload))}", claims


def verify(ring: KeyRing, token: str, now: float) -> TokenClaims:
    """The claims of a token this ring signed and that has not expired, else TokenError.

    The signature is checked first, against every live key (a handful), and only a
    payload that verifies is decoded: a forged token costs a few HMACs and is never
    parsed, whatever it holds.
    """
    if not token.startswith(TOKEN_PREFIX) or token.count(".") != 1 or len(token) > MAX_TOKEN_CHARS:
        raise TokenError
    payload, _, signature = token[len(TOKEN_PREFIX):].partition(".")
    try:
        given = _unb64(signature)
    except (ValueError, binascii.Error):
        raise TokenError from None
    if len(given) != hashlib.sha256().digest_size or not payload:
        raise TokenError
    key_id = _signed_by(ring.keys(), payload, given) or _signed_by(ring.keys(reload=True), payload, given)
    if key_id is None:
        raise TokenError
    try:
        document = json.loads(_unb64(payload))
        claims = TokenClaims(str(document["jti"]), str(document["ten"]), tuple(map(str, document["scp"])),
                             None if document["mdl"] is None else tuple(map(str, document["mdl"])), int(document["iat"]),
                             int(document["exp"]), str(document["kid"]), str(document.get("sub") or ""))
    except (ValueError, binascii.Error, KeyError, TypeError, AttributeError, RecursionError):
        raise TokenError from None
    if document.get("v") != 1 or claims.key_id != key_id or claims.expires_at <= now:
        raise TokenError
    return claims


def _signed_by(keys: dict[str, bytes], payload: str, given: bytes) -> str | None:
    for key_id, key in keys.items():
        if hmac.compare_digest(given, _sign(key, payload)):
            return key_id
    return None


def _sign(key: bytes, payload: str) -> bytes:
    return hmac.new(key, (TOKEN_PREFIX + payload).encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    """Canonical base64url only: a last character whose unused bits are set decodes to the
    same bytes as another, so one signature would be several tokens (one of them the
    token it was minted as with its end changed); only the text `_b64` writes is read."""
    if not text or any(c not in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" for c in text):
        raise ValueError("not base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise ValueError("not canonical base64url")
    return data


# -- key rings --------------------------------------------------------------------------


KEY_FIELD = "key:"
MIN_KEY_CHARS = 32


def parse_key_document(text: str) -> tuple[str, dict[str, bytes]]:
    """`{"current": "<kid>", "key:<kid>": "<at least 32 random characters>", ...}`

    Flat, so that Secrets Manager can generate the first key itself (GenerateSecretString
    with `GenerateStringKey: "key:k1"`) and rotation adds keys beside the old ones.
    """
    try:
        document = json.loads(text)
        current = document["current"]
        keys = {name[len(KEY_FIELD):]: value.encode() for name, value in document.items() if name.startswith(KEY_FIELD)}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError('the signing key document is not {"current": kid, "key:<kid>": secret, ...}') from None
    if current not in keys or any(len(key) < MIN_KEY_CHARS for key in keys.values()):
        raise ValueError("the current key must be listed, and every key must hold at least 32 characters")
    return current, keys


def new_key_document(previous: str | None = None, now: float | None = None, keep_s: float = 2 * MAX_TTL_S) -> str:
    """A document with a new current key. Earlier keys stay while tokens they signed may
    still be alive (`keep_s`, twice the longest token life), so rotation never breaks one."""
    now = time.time() if now is None else now
    document: dict[str, Any] = {"current": "", "created": {}}
    if previous:
        old = json.loads(previous)
        created = old.get("created", {})
        for name, value in old.items():
            kid = name[len(KEY_FIELD):] if name.startswith(KEY_FIELD) else None
            if kid is None:
                continue
            # A key is retired once it stopped being current longer ago than any token lives.
            retired_at = created.get(f"retired:{kid}")
            if kid == old.get("current"):
                retired_at = now
            if retired_at is not None and now - retired_at > keep_s:
                continue
            document[name] = value
            if kid in created:
                document["created"][kid] = created[kid]
            if retired_at is not None:
                document["created"][f"retired:{kid}"] = retired_at
    key_id = f"k{int(now)}-{secrets.token_hex(3)}"
    document[KEY_FIELD + key_id] = secrets.token_urlsafe(48)
    document["created"][key_id] = now
    document["current"] = key_id
    return json.dumps(document, indent=2)


class CachedKeyRing:
    """Keys from a loader (Secrets Manager, a file), kept for `ttl_s` and reloaded early, at
    most once per `min_reload_s`, when a token verifies with none of them (a rotation)."""

    def __init__(self, load: Callable[[], str], ttl_s: float = 300.0, min_reload_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._load, self._ttl_s, self._min_reload_s, self._clock = load, ttl_s, min_reload_s, clock
        self._lock = threading.Lock()
        self._loaded_at = -1e18
        self._current = ""
        self._keys: dict[str, bytes] = {}

    def _refresh(self, force: bool) -> None:
        with self._lock:
            age = self._clock() - self._loaded_at
            if age < self._ttl_s and not (force and age >= self._min_reload_s):
                return
            self._current, self._keys = parse_key_document(self._load())
            self._loaded_at = self._clock()

    def current(self) -> tuple[str, bytes]:
        self._refresh(force=False)
        return self._current, self._keys[self._current]

    def keys(self, reload: bool = False) -> dict[str, bytes]:
        self._refresh(force=reload)
        return dict(self._keys)


def file_key_ring(path: str | Path) -> CachedKeyRing:
    return CachedKeyRing(lambda: Path(path).read_text(), ttl_s=5.0, min_reload_s=1.0)


def secrets_manager_key_ring(secret_id: str, client: Any) -> CachedKeyRing:
    """The ring in the secret `secret_id`, read through `client` (the composition root's) on first use."""

    def load() -> str:
        return client.get_secret_value(SecretId=secret_id)["SecretString"]

    return CachedKeyRing(load)
