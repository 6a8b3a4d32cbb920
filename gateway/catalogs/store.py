"""The catalog store interface (implemented by the SQLite and DynamoDB stores).

An entry's versions are never overwritten. Each entry has a head (its latest version's
number, whether it asks for a daily refit, the version that made it enforcing): listing a
tenant's entries, counting them and finding the entries due for a refit read heads, never
versions. A version that is no longer the latest expires (`expires_at`), and the oldest
past an entry's count are deleted (CatalogService.put says which are kept).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from gateway.catalogs.model import CatalogVersion


class VersionTaken(Exception):
    """Another writer created this version first."""


class TooManyEntries(Exception):
    """The tenant has as many entries as it may have: a new one is not written."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.count = count


class CatalogStore(Protocol):
    def insert_catalog_version(self, version: CatalogVersion, *, replaces: int, expire: dict[int, float],
                               max_entries: int) -> None:
        """Create `version` as the entry's latest where its latest is `replaces` (0: the entry is
        new, and the tenant has fewer than `max_entries`), and in the same write set the
        `expires_at` of the versions in `expire`. VersionTaken if another version was written
        first, TooManyEntries if a new entry would pass the count; nothing is written then."""
        ...

    def delete_catalog_versions(self, tenant_id: str, name: str, below: int, keep: Iterable[int]) -> int:
        """Delete the entry's versions numbered under `below`, except those in `keep`, and any
        expired; the number deleted."""
        ...

    def extend_catalog_version(self, tenant_id: str, name: str, version: int, until: float) -> None:
        """Move an expiring version's `expires_at` to `until` where it is earlier (a decision
        named it: it lives as long as that decision's record)."""
        ...

    def get_catalog_version(self, tenant_id: str, name: str, version: int) -> CatalogVersion | None: ...

    def latest_catalog_version(self, tenant_id: str, name: str) -> CatalogVersion | None: ...

    def list_catalog_versions(self, tenant_id: str, name: str, after: int = 0, limit: int | None = None
                              ) -> list[CatalogVersion]:
        """The live versions numbered above `after`, oldest first, at most `limit` of them."""
        ...

    def list_catalog_tenants(self) -> Iterator[str]:
        """The ids of the tenants that have a catalog entry, from the entries' heads (the
        scheduled refit walks them; no request path lists tenants)."""
        ...

    def due_refits(self, tenant_id: str, after: str, limit: int) -> list[str]:
        """The names, after `after` in name order, of up to `limit` of the tenant's entries
        whose latest version asks for a daily refit."""
        ...

    def count_catalogs(self, tenant_id: str) -> int: ...

    def list_catalogs(self, tenant_id: str, after: str = "", limit: int | None = None) -> Iterable[CatalogVersion]:
        """The latest version of the tenant's entries named after `after`, by name, at most
        `limit` (read as they are consumed, where the store reads them one by one)."""
        ...
