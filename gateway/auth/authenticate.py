"""Turn a bearer credential into a principal, or refuse it."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.auth.credentials import Principal, api_key_id, bearer_credential, same_hash
from gateway.auth.store import TenantStore
from gateway.errors import Unauthenticated

# Touching last-used on every call would make each request a write; once a minute is enough.
LAST_USED_RESOLUTION_S = 60.0


class Authenticator:
    def __init__(self, store: TenantStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    def authenticate(self, authorization: str | None) -> Principal:
        credential = bearer_credential(authorization)
        if credential is None:
            raise Unauthenticated("missing credentials: send Authorization: Bearer <API key>")
        key_id = api_key_id(credential)
        record = self.store.get_api_key(key_id) if key_id else None
        now = self.clock()
        # One message for every failure, so a caller learns nothing about which keys exist.
        if record is None or not same_hash(credential, record.key_hash):
            raise Unauthenticated("invalid credentials")
        if record.revoked_at is not None or (record.expires_at is not None and record.expires_at <= now):
            raise Unauthenticated("invalid credentials")
        if record.last_used_at is None or now - record.last_used_at > LAST_USED_RESOLUTION_S:
            self.store.touch_api_key(record.key_id, now)
        return Principal(
            tenant_id=record.tenant_id,
            scopes=frozenset(record.scopes),
            models=frozenset(record.models) if record.models is not None else None,
            credential_id=record.key_id,
        )
