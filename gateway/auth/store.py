"""The tenant store interface: tenants and API key records.

Implementations: `gateway.stores.sqlite` (the embedded local store); DynamoDB in AWS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    name: str
    created_at: float


@dataclass(frozen=True)
class ApiKeyRecord:
    key_id: str
    tenant_id: str
    key_hash: str
    scopes: tuple[str, ...]
    models: tuple[str, ...] | None
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    last_used_at: float | None = None
    name: str = ""


class TenantStore(Protocol):
    def put_tenant(self, tenant: Tenant) -> None: ...

    def get_tenant(self, tenant_id: str) -> Tenant | None: ...

    def put_api_key(self, record: ApiKeyRecord) -> None: ...

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None: ...

    def revoke_api_key(self, key_id: str, when: float) -> bool: ...

    def touch_api_key(self, key_id: str, when: float) -> None: ...
