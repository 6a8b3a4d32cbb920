"""The embedded SQLite store of the local stack.

One file, WAL mode, a connection per thread. Every write is one transaction, so a
crash never leaves a half-written record.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from gateway.auth.store import ApiKeyRecord, PrincipalRule, Tenant

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
CREATE TABLE IF NOT EXISTS principal_rules (
    principal_arn TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants(tenant_id),
    scopes        TEXT NOT NULL,
    models        TEXT,
    created_at    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS revoked_tokens (
    token_id   TEXT PRIMARY KEY,
    tenant_id  TEXT NOT NULL,
    expires_at REAL NOT NULL
);
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

    # -- principal rules --------------------------------------------------------------

    def put_principal_rule(self, rule: PrincipalRule) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO principal_rules (principal_arn, tenant_id, scopes, models, created_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(principal_arn) DO UPDATE SET tenant_id = excluded.tenant_id, scopes = excluded.scopes,"
                " models = excluded.models",
                (rule.principal_arn, rule.tenant_id, json.dumps(list(rule.scopes)), _json_or_null(rule.models), rule.created_at),
            )

    def get_principal_rule(self, principal_arn: str) -> PrincipalRule | None:
        row = self._connect().execute("SELECT * FROM principal_rules WHERE principal_arn = ?", (principal_arn,)).fetchone()
        if row is None:
            return None
        return PrincipalRule(row["principal_arn"], row["tenant_id"], tuple(json.loads(row["scopes"])),
                             _tuple_or_none(row["models"]), row["created_at"])

    def delete_principal_rule(self, principal_arn: str) -> bool:
        with self._connect() as db:
            return db.execute("DELETE FROM principal_rules WHERE principal_arn = ?", (principal_arn,)).rowcount == 1

    # -- API keys ---------------------------------------------------------------------

    def put_api_key(self, record: ApiKeyRecord) -> None:
        try:
            self._insert_api_key(record)
        except sqlite3.IntegrityError:
            raise ValueError(f"key id {record.key_id!r} exists") from None

    def _insert_api_key(self, record: ApiKeyRecord) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO api_keys (key_id, tenant_id, key_hash, scopes, models, created_at, expires_at,"
                " revoked_at, last_used_at, name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.key_id, record.tenant_id, record.key_hash, json.dumps(list(record.scopes)),
                    _json_or_null(record.models),
                    record.created_at, record.expires_at, record.revoked_at, record.last_used_at, record.name,
                ),
            )

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        row = self._connect().execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        return None if row is None else _api_key(row)

    def list_api_keys(self, tenant_id: str) -> list[ApiKeyRecord]:
        rows = self._connect().execute("SELECT * FROM api_keys WHERE tenant_id = ? ORDER BY created_at", (tenant_id,))
        return [_api_key(row) for row in rows]

    def revoke_api_key(self, key_id: str, when: float) -> bool:
        with self._connect() as db:
            cursor = db.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (when, key_id))
        return cursor.rowcount == 1

    def touch_api_key(self, key_id: str, when: float) -> None:
        with self._connect() as db:
            db.execute("UPDATE api_keys SET last_used_at = ? WHERE key_id = ?", (when, key_id))

    # -- token revocations --------------------------------------------------------------

    def revoke_token(self, token_id: str, tenant_id: str, expires_at: float) -> None:
        with self._connect() as db:
            db.execute("INSERT OR IGNORE INTO revoked_tokens (token_id, tenant_id, expires_at) VALUES (?, ?, ?)",
                       (token_id, tenant_id, expires_at))

    def revoked_tokens(self, now: float) -> set[str]:
        rows = self._connect().execute("SELECT token_id FROM revoked_tokens WHERE expires_at > ?", (now,))
        return {row["token_id"] for row in rows}


def _json_or_null(values: tuple[str, ...] | None) -> str | None:
    return None if values is None else json.dumps(list(values))


def _tuple_or_none(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(json.loads(text))


def _api_key(row: sqlite3.Row) -> ApiKeyRecord:
    return ApiKeyRecord(
        key_id=row["key_id"],
        tenant_id=row["tenant_id"],
        key_hash=row["key_hash"],
        scopes=tuple(json.loads(row["scopes"])),
        models=_tuple_or_none(row["models"]),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        last_used_at=row["last_used_at"],
        name=row["name"],
    )

