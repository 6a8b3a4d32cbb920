"""Storage adapters behind the store interfaces of the domain: one class per interface
and storage, in `gateway.stores.sqlite` (the embedded local store) and
`gateway.stores.dynamodb` (AWS).

`Stores` is what one deployment has: tenants, counters and idempotent requests always,
catalogs, records and batches where they are configured (SQLite holds them all;
DynamoDB the ones whose table is set).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.auth.store import CounterStore, TenantStore
from gateway.batches.model import BatchStore
from gateway.catalogs.store import CatalogStore
from gateway.decisions.idempotency import IdempotencyStore
from gateway.decisions.records import RecordStore


@dataclass(frozen=True, slots=True)
class Stores:
    tenants: TenantStore
    counters: CounterStore
    idempotency: IdempotencyStore
    catalogs: CatalogStore | None = None
    records: RecordStore | None = None
    batches: BatchStore | None = None  # batch files, uploads, batches and their ledgers
