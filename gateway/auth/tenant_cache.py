"""A tenant's settings (catalog-only, limits) as the hot path reads them: from the store
at most once per `ttl_s` per tenant, in a bounded LRU. A changed limit takes effect
within `ttl_s` (60 s), which the README states."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from gateway.auth.store import DEFAULT_LIMITS, Tenant, TenantLimits

TENANT_CACHE_S = 60.0
TENANT_CACHE_ENTRIES = 4096


class TenantCache:
    def __init__(self, store: Any, ttl_s: float = TENANT_CACHE_S, clock: Callable[[], float] = time.monotonic,
                 entries: int = TENANT_CACHE_ENTRIES) -> None:
        self.store, self.ttl_s, self.clock, self._entries = store, ttl_s, clock, entries
        self._cache: OrderedDict[str, tuple[float, Tenant | None]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant_id: str) -> Tenant | None:
        if self.store is None:
            return None
        now = self.clock()
        with self._lock:
            hit = self._cache.get(tenant_id)
            if hit is not None and hit[0] > now:
                self._cache.move_to_end(tenant_id)
                return hit[1]
        tenant = self.store.get_tenant(tenant_id)
        with self._lock:
            self._cache[tenant_id] = (now + self.ttl_s, tenant)
            while len(self._cache) > self._entries:
                self._cache.popitem(last=False)
        return tenant

    def limits(self, tenant_id: str) -> TenantLimits:
        tenant = self.get(tenant_id)
        return tenant.limits if tenant is not None else DEFAULT_LIMITS

    def catalog_only(self, tenant_id: str) -> bool:
        tenant = self.get(tenant_id)
        return bool(tenant and tenant.catalog_only)
