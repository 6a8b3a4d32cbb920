"""The embedded SQLite store of the local stack.

One file, WAL mode, a connection per thread. Every write is one transaction, so a
crash never leaves a half-written record.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from gateway.auth.store import ApiKeyRecord, Tenant

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    tenant_id  TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id       TEXT PRIMARY KEY,
    tenant_id    TEXT NOT NULL REFERENCES tenants(tenant_id),
    key_hash     TEXT NOT NULL,
    scopes       TEXT NOT NULL,
    models       TEXT,
    created_at   REAL NOT NULL,
    expires_at   REAL,
    revoked_at   REAL,
    last_used_at REAL,
    name         TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS api_keys_by_tenant ON api_keys(tenant_id);
"""


class SQLiteStore:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._connect() as db:
            db.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=10, isolation_level=None if self.path == ":memory:" else "DEFERRED")
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA foreign_keys = ON")
            if self.path != ":memory:":
                db.execute("PRAGMA journal_mode = WAL")
            self._local.db = db
        return db

    # -- tenants ----------------------------------------------------------------------

    def put_tenant(self, tenant: Tenant) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO tenants (tenant_id, name, created_at) VALUES (?, ?, ?)"
                " ON CONFLICT(tenant_id) DO UPDATE SET name = excluded.name",
                (tenant.tenant_id, tenant.name, tenant.created_at),
            )

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        row = self._connect().execute("SELECT * FROM tenants WHERE tenant_id = ?", (tenant_id,)).fetchone()
        return Tenant(row["tenant_id"], row["name"], row["created_at"]) if row else None

    # -- API keys ---------------------------------------------------------------------

    def put_api_key(self, record: ApiKeyRecord) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO api_keys (key_id, tenant_id, key_hash, scopes, models, created_at, expires_at,"
                " revoked_at, last_used_at, name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.key_id, record.tenant_id, record.key_hash, json.dumps(list(record.scopes)),
                    None if record.models is None else json.dumps(list(record.models)),
                    record.created_at, record.expires_at, record.revoked_at, record.last_used_at, record.name,
                ),
            )

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        row = self._connect().execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        if row is None:
            return None
        return ApiKeyRecord(
            key_id=row["key_id"],
            tenant_id=row["tenant_id"],
            key_hash=row["key_hash"],
            scopes=tuple(json.loads(row["scopes"])),
            models=None if row["models"] is None else tuple(json.loads(row["models"])),
            created_at=row["created_at"],
            expires_at=row["expires_at"],
            revoked_at=row["revoked_at"],
            last_used_at=row["last_used_at"],
            name=row["name"],
        )

    def revoke_api_key(self, key_id: str, when: float) -> bool:
        with self._connect() as db:
            cursor = db.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (when, key_id))
        return cursor.rowcount == 1

    def touch_api_key(self, key_id: str, when: float) -> None:
        with self._connect() as db:
            db.execute("UPDATE api_keys SET last_used_at = ? WHERE key_id = ?", (when, key_id))
