"""The tenant store interface: tenants, IAM principal rules, API key records and token
revocations. Two implementations pass one contract test suite:
`gateway.stores.sqlite` (the embedded local store) and `gateway.stores.dynamodb` (AWS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    name: str
    created_at: float
    catalog_only: bool = False  # refuse inline questions: every question must name a catalog entry


@dataclass(frozen=True)
class PrincipalRule:
    """An IAM principal (normalised ARN) that acts for a tenant, with what it may do."""

    principal_arn: str
    tenant_id: str
    scopes: tuple[str, ...]
    models: tuple[str, ...] | None
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

    def put_principal_rule(self, rule: PrincipalRule) -> None: ...

    def get_principal_rule(self, principal_arn: str) -> PrincipalRule | None: ...

    def delete_principal_rule(self, principal_arn: str) -> bool: ...

    def put_api_key(self, record: ApiKeyRecord) -> None:
        """Insert a new key record; a key id that exists already raises ValueError."""
        ...

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None: ...

    def list_api_keys(self, tenant_id: str) -> list[ApiKeyRecord]: ...

    def revoke_api_key(self, key_id: str, when: float) -> bool:
        """True when this call revoked it (False: unknown or already revoked)."""
        ...

    def touch_api_key(self, key_id: str, when: float) -> None: ...

    def revoke_token(self, token_id: str, tenant_id: str, expires_at: float) -> None: ...

    def revoked_tokens(self, now: float) -> set[str]:
        """Ids of revoked tokens that have not expired yet (expired ones verify as expired anyway)."""
        ...
