"""The catalog and record store interfaces (implemented by the SQLite and DynamoDB stores)."""

from __future__ import annotations

from typing import Any, Protocol

from gateway.catalogs.model import CatalogVersion


class VersionTaken(Exception):
    """Another writer created this version first."""


class CatalogStore(Protocol):
    def insert_catalog_version(self, version: CatalogVersion) -> None:
        """Create a version; raises VersionTaken if (tenant, name, version) exists. Never overwrites."""
        ...

    def get_catalog_version(self, tenant_id: str, name: str, version: int) -> CatalogVersion | None: ...

    def latest_catalog_version(self, tenant_id: str, name: str) -> CatalogVersion | None: ...

    def list_catalog_versions(self, tenant_id: str, name: str) -> list[CatalogVersion]: ...

    def list_catalogs(self, tenant_id: str) -> list[CatalogVersion]:
        """The latest version of every entry of the tenant, by name."""
        ...


class RecordStore(Protocol):
    def put_record(self, tenant_id: str, record_id: str, created_at: float, catalogs: list[str], body: dict[str, Any],
                   expires_at: float) -> None: ...

    def get_record(self, tenant_id: str, record_id: str) -> dict[str, Any] | None:
        """The record body with its `outcome` (or None), only if it belongs to the tenant."""
        ...

    def set_outcome(self, tenant_id: str, record_id: str, outcome: dict[str, Any]) -> bool:
        """Attach (or replace) the outcome; False when the tenant has no such record."""
        ...

    def list_records(self, tenant_id: str, *, catalog: str | None = None, since: float | None = None,
                     limit: int = 100) -> list[dict[str, Any]]:
        """Newest first."""
        ...
