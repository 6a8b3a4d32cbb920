"""Is a credential still good? Asked on every request, answered within a stated bound.

A verified token or API key stays verified in three caches: API Gateway's authorizer
cache (per credential, `ReauthorizeEvery`), the authorizer's own cache, and the
function's warm state. None of them may outlive a revocation by more than
`check_s` (default 10 s): every request, whichever cache served it, asks this
check, which looks the credential up by id in the store and remembers each answer
for at most `check_s`. The lookups are by key (one item each, whatever the number of
revocations), and the memory is a bounded LRU.

What revokes a credential:
- an API key revoked (or expired) in its own record;
- a token revoked by id (`POST /v1/tokens/revoke`, the admin CLI);
- a "not before" time, refusing every token minted at or before it, kept per tenant
  (`tenant:<id>`), per IAM principal that mints (`principal:<arn>`: unmapping a
  principal sets it), per signing key (`key:<kid>`: an emergency rotation sets it, so
  even a token forged with a stolen key is refused at once), and for everything
  (`all`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.auth.credentials import Principal
from gateway.auth.store import TenantStore
from gateway.auth.ttl_cache import TtlLru

DEFAULT_CHECK_S = 10.0
CACHE_ENTRIES = 4096


class RevocationCheck:
    def __init__(self, store: TenantStore, check_s: float = DEFAULT_CHECK_S, clock: Callable[[], float] = time.time,
                 entries: int = CACHE_ENTRIES) -> None:
        self.store = store
        self.check_s = check_s
        self.clock = clock
        self._answers = TtlLru(check_s, entries, clock)

    def refused(self, principal: Principal) -> bool:
        """True when the credential behind `principal` was revoked (or, for a key, expired)."""
        if principal.kind == "api_key":
            return self._answers.get(f"apikey:{principal.credential_id}", lambda: self._api_key_refused(principal))
        if principal.kind != "token":
            return False  # IAM callers: their mapping rule is read on every request
        if self._answers.get(f"token:{principal.tenant_id}:{principal.credential_id}",
                            lambda: self.store.token_revoked(principal.tenant_id, principal.credential_id, self.clock())):
            return True
        issued_at = principal.issued_at if principal.issued_at is not None else 0.0
        subjects = ["all", f"tenant:{principal.tenant_id}", f"key:{principal.key_id}"]
        if principal.subject:
            subjects.append(f"principal:{principal.subject}")
        for subject in subjects:
            not_before = self._answers.get(f"nb:{subject}", lambda s=subject: self.store.not_before(s))
            # At or before: a token minted in the second of the revocation is refused too.
            if not_before is not None and issued_at <= not_before:
                return True
        return False

    def key_dropped(self, key_id: str) -> bool:
        """An emergency rotation dropped this signing key (its "not before" is in the future)."""
        not_before = self._answers.get(f"nb:key:{key_id}", lambda: self.store.not_before(f"key:{key_id}"))
        return not_before is not None and not_before > self.clock()

    def _api_key_refused(self, principal: Principal) -> bool:
        record = self.store.get_api_key(principal.credential_id)
        now = self.clock()
        return (record is None or record.revoked_at is not None or record.tenant_id != principal.tenant_id
                or (record.expires_at is not None and record.expires_at <= now))

    def forget(self, *keys: str) -> None:
        """A revocation made through this process applies here at once."""
        self._answers.forget(*keys)
