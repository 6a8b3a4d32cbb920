"""Provisioning: create tenants and issue or revoke API keys."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from gateway.auth.credentials import SCOPES, NewApiKey, api_key_id, hash_api_key, new_api_key
from gateway.auth.store import MIN_ENDPOINT_SECONDS_PER_MINUTE, ApiKeyRecord, Tenant, TenantStore
from systemone.sidechannel import MAX_WEIGHT, MIN_WEIGHT

_TENANT_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class ProvisioningError(ValueError):
    pass


def create_tenant(store: TenantStore, tenant_id: str, name: str = "", *, catalog_only: bool | None = None) -> Tenant:
    """Create a tenant, or return it; `catalog_only` given changes its policy."""
    if not _TENANT_ID.match(tenant_id):
        raise ProvisioningError("a tenant id is 1-63 lowercase letters, digits and dashes, starting with a letter or digit")
    existing = store.get_tenant(tenant_id)
    if existing is not None and (catalog_only is None or existing.catalog_only == catalog_only):
        return existing
    if existing is not None:
        tenant = replace(existing, catalog_only=bool(catalog_only))
    else:
        tenant = Tenant(tenant_id, name or tenant_id, time.time(), bool(catalog_only))
    store.put_tenant(tenant)
    return tenant


_LIMIT_BOUNDS = {"rate_per_s": (0.01, 10_000), "burst": (1, 100_000), "max_options": (2, 102_000),
                 "max_text_bytes": (1024, 6 * 1024 * 1024), "max_request_tokens": (256, 10_000_000),
                 "max_chat_tokens": (1, 32_768), "max_in_flight": (1, 10_000),
                 "monthly_budget_usd": (0.0, 10_000_000.0),
                 "endpoint_seconds_per_minute": (MIN_ENDPOINT_SECONDS_PER_MINUTE, 1_000_000.0),
                 "share_weight": (MIN_WEIGHT, MAX_WEIGHT)}
# Limits that may be None: no limit of that kind.
_OPTIONAL_LIMITS = {"max_request_tokens", "max_in_flight", "monthly_budget_usd", "endpoint_seconds_per_minute"}


def set_limits(store: TenantStore, tenant_id: str, **changes: Any) -> Tenant:
    """Change some of a tenant's limits (the others stay); each is checked against its bounds."""
    tenant = store.get_tenant(tenant_id)
    if tenant is None:
        raise ProvisioningError(f"no tenant {tenant_id!r}")
    for name, value in changes.items():
        if name == "usage_key" or (name in _OPTIONAL_LIMITS and value is None):
            continue
        if name not in _LIMIT_BOUNDS:
            raise ProvisioningError(f"unknown limit {name!r} (known: {', '.join(_LIMIT_BOUNDS)})")
        low, high = _LIMIT_BOUNDS[name]
        if not low <= value <= high:
            raise ProvisioningError(f"{name} must be between {low} and {high}")
    limits = replace(tenant.limits, **changes)
    if limits.burst < limits.rate_per_s:
        raise ProvisioningError("burst must be at least the rate (a second's worth of requests)")
    updated = replace(tenant, limits=limits)
    store.put_tenant(updated)
    return updated


def checked_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    scopes = tuple(sorted(set(scopes)))
    unknown = set(scopes) - set(SCOPES)
    if unknown:
        raise ProvisioningError(f"unknown scopes: {', '.join(sorted(unknown))} (known: {', '.join(SCOPES)})")
    return scopes


def issue_api_key(
    store: TenantStore,
    tenant_id: str,
    scopes: Iterable[str],
    *,
    models: Iterable[str] | None = None,
    ttl_s: float | None = None,
    name: str = "",
    key: str | None = None,
) -> NewApiKey:
    """Store a new key's hash and return the key (the only time it is seen). `key` imports a given one."""
    scopes = checked_scopes(scopes)
    if store.get_tenant(tenant_id) is None:
        raise ProvisioningError(f"no tenant {tenant_id!r}")
    if key is None:
        issued = new_api_key()
    else:
        key_id = api_key_id(key)
        if key_id is None:
            raise ProvisioningError("an API key reads dgk_<16 hex digits>_<43 base64url characters>")
        existing = store.get_api_key(key_id)
        if existing is not None:
            if existing.key_hash == hash_api_key(key) and existing.tenant_id == tenant_id:
                return NewApiKey(key_id, key)  # importing the same key again is a no-op
            raise ProvisioningError("that key id is taken")
        issued = NewApiKey(key_id, key)
    now = time.time()
    store.put_api_key(
        ApiKeyRecord(
            key_id=issued.key_id,
            tenant_id=tenant_id,
            key_hash=hash_api_key(issued.secret),
            scopes=scopes,
            models=None if models is None else tuple(sorted(set(models))),
            created_at=now,
            expires_at=None if ttl_s is None else now + ttl_s,
            name=name,
        )
    )
    return issued
