"""A tenant's settings (catalog-only, limits) as the hot path reads them: from the store
at most once per `ttl_s` per tenant, in a bounded LRU. A changed limit takes effect
within `ttl_s` (60 s), which the README states."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.auth.store import DEFAULT_LIMITS, Tenant, TenantLimits, TenantStore
from gateway.auth.ttl_cache import TtlLru

TENANT_CACHE_S = 60.0
TENANT_CACHE_ENTRIES = 4096


class TenantCache:
    def __init__(self, store: TenantStore, ttl_s: float = TENANT_CACHE_S, clock: Callable[[], float] = time.monotonic,
                 entries: int = TENANT_CACHE_ENTRIES) -> None:
        self.store = store
        self._tenants = TtlLru(ttl_s, entries, clock)

    def get(self, tenant_id: str) -> Tenant | None:
        if self.store is None:
            return None
        return self._tenants.get(tenant_id, lambda: self.store.get_tenant(tenant_id))

    def limits(self, tenant_id: str) -> TenantLimits:
        tenant = self.get(tenant_id)
        return tenant.limits if tenant is not None else DEFAULT_LIMITS
