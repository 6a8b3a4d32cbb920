"""The embedded SQLite stores of the local stack: one file, one class per store interface."""

from __future__ import annotations

from pathlib import Path

from gateway.stores import Stores
from gateway.stores.sqlite.batches import SQLiteBatches
from gateway.stores.sqlite.catalogs import SQLiteCatalogs
from gateway.stores.sqlite.counters import SQLiteCounters
from gateway.stores.sqlite.database import Database
from gateway.stores.sqlite.idempotency import SQLiteIdempotency
from gateway.stores.sqlite.records import SQLiteRecords
from gateway.stores.sqlite.tenants import SQLiteTenants


def open_sqlite(path: str | Path) -> Stores:
    """Every store of a deployment in the SQLite file at `path` (created, with its tables, where missing)."""
    db = Database(path)
    return Stores(tenants=SQLiteTenants(db), counters=SQLiteCounters(db), idempotency=SQLiteIdempotency(db),
                  catalogs=SQLiteCatalogs(db), records=SQLiteRecords(db), batches=SQLiteBatches(db))
