"""The catalog store interface (implemented by the SQLite and DynamoDB stores)."""

from __future__ import annotations

from typing import Protocol

from gateway.catalogs.model import CatalogVersion


class VersionTaken(Exception):
    """Another writer created this version first."""


class CatalogStore(Protocol):
    def insert_catalog_version(self, version: CatalogVersion) -> None:
        """Create a version; raises VersionTaken if (tenant, name, version) exists. Never overwrites."""
        ...

    def get_catalog_version(self, tenant_id: str, name: str, version: int) -> CatalogVersion | None: ...

    def latest_catalog_version(self, tenant_id: str, name: str) -> CatalogVersion | None: ...

    def list_catalog_versions(self, tenant_id: str, name: str, after: int = 0, limit: int | None = None
                              ) -> list[CatalogVersion]:
        """The versions numbered above `after`, oldest first, at most `limit` of them."""
        ...

    def list_catalog_tenants(self) -> list[str]:
        """The ids of the tenants that have a catalog entry (the scheduled refit walks them;
        no request path lists tenants)."""
        ...

    def list_catalogs(self, tenant_id: str) -> list[CatalogVersion]:
        """The latest version of every entry of the tenant, by name."""
        ...
