"""Storage adapters behind the store interfaces of the domain.

`Stores` is what one deployment has: tenants and keys always, catalogs and records
where they are configured (the SQLite store holds all four; the DynamoDB store the
ones whose table is set). Each adapter says which it serves (`stores()`), so the
composition root never probes an object for methods.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.auth.store import TenantStore
from gateway.catalogs.store import CatalogStore
from gateway.decisions.idempotency import IdempotencyStore
from gateway.decisions.records import RecordStore


@dataclass(frozen=True, slots=True)
class Stores:
    tenants: TenantStore
    catalogs: CatalogStore | None
    records: RecordStore | None
    idempotency: IdempotencyStore | None = None
