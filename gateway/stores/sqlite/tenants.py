"""Tenants, IAM principal rules, API key records and token revocations in SQLite."""

from __future__ import annotations

import json
import sqlite3

from gateway.auth.store import ApiKeyRecord, PrincipalRule, Tenant, TenantLimits
from gateway.stores.sqlite.database import Database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    tenant_id    TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    created_at   REAL NOT NULL,
    catalog_only INTEGER NOT NULL DEFAULT 0,
    limits       TEXT
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
CREATE TABLE IF NOT EXISTS token_revocations (
    tenant_id  TEXT NOT NULL,
    token_id   TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (tenant_id, token_id)
);
CREATE TABLE IF NOT EXISTS not_before (
    subject TEXT PRIMARY KEY,
    at      REAL NOT NULL
);
"""


class SQLiteTenants:
    def __init__(self, db: Database) -> None:
        self.db = db
        db.create(_SCHEMA)
        with db.connect() as connection:
            _migrate(connection)

    # -- tenants ----------------------------------------------------------------------

    def put_tenant(self, tenant: Tenant) -> None:
        with self.db.connect() as db:
            db.execute(
                "INSERT INTO tenants (tenant_id, name, created_at, catalog_only, limits) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(tenant_id) DO UPDATE SET name = excluded.name, catalog_only = excluded.catalog_only,"
                " limits = excluded.limits",
                (tenant.tenant_id, tenant.name, tenant.created_at, int(tenant.catalog_only), json.dumps(tenant.limits.as_json())),
            )

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        row = self.db.connect().execute("SELECT * FROM tenants WHERE tenant_id = ?", (tenant_id,)).fetchone()
        if row is None:
            return None
        limits = TenantLimits.from_json(json.loads(row["limits"]) if row["limits"] else None)
        return Tenant(row["tenant_id"], row["name"], row["created_at"], bool(row["catalog_only"]), limits)

    # -- principal rules --------------------------------------------------------------

    def put_principal_rule(self, rule: PrincipalRule) -> None:
        with self.db.connect() as db:
            db.execute(
                "INSERT INTO principal_rules (principal_arn, tenant_id, scopes, models, created_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(principal_arn) DO UPDATE SET tenant_id = excluded.tenant_id, scopes = excluded.scopes,"
                " models = excluded.models",
                (rule.principal_arn, rule.tenant_id, json.dumps(list(rule.scopes)), _json_or_null(rule.models), rule.created_at),
            )

    def get_principal_rule(self, principal_arn: str) -> PrincipalRule | None:
        row = self.db.connect().execute("SELECT * FROM principal_rules WHERE principal_arn = ?", (principal_arn,)).fetchone()
        if row is None:
            return None
        return PrincipalRule(row["principal_arn"], row["tenant_id"], tuple(json.loads(row["scopes"])),
                             _tuple_or_none(row["models"]), row["created_at"])

    def delete_principal_rule(self, principal_arn: str) -> bool:
        with self.db.connect() as db:
            return db.execute("DELETE FROM principal_rules WHERE principal_arn = ?", (principal_arn,)).rowcount == 1

    # -- API keys ---------------------------------------------------------------------

    def put_api_key(self, record: ApiKeyRecord) -> None:
        try:
            with self.db.connect() as db:
                db.execute(
                    "INSERT INTO api_keys (key_id, tenant_id, key_hash, scopes, models, created_at, expires_at,"
                    " revoked_at, last_used_at, name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (record.key_id, record.tenant_id, record.key_hash, json.dumps(list(record.scopes)),
                     _json_or_null(record.models), record.created_at, record.expires_at, record.revoked_at,
                     record.last_used_at, record.name),
                )
        except sqlite3.IntegrityError:
            raise ValueError(f"key id {record.key_id!r} exists") from None

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        row = self.db.connect().execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        return None if row is None else _api_key(row)

    def list_api_keys(self, tenant_id: str) -> list[ApiKeyRecord]:
        rows = self.db.connect().execute("SELECT * FROM api_keys WHERE tenant_id = ? ORDER BY created_at", (tenant_id,))
        return [_api_key(row) for row in rows]

    def revoke_api_key(self, key_id: str, when: float) -> bool:
        with self.db.connect() as db:
            cursor = db.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", (when, key_id))
        return cursor.rowcount == 1

    def touch_api_key(self, key_id: str, when: float) -> None:
        with self.db.connect() as db:
            db.execute("UPDATE api_keys SET last_used_at = ? WHERE key_id = ?", (when, key_id))

    # -- token revocations --------------------------------------------------------------

    def revoke_token(self, token_id: str, tenant_id: str, expires_at: float) -> None:
        with self.db.connect() as db:
            # What TTL does in DynamoDB: a new revocation expires within 12 h from now (the
            # longest a token lives), so one expiring 13 h before it is long past.
            db.execute("DELETE FROM token_revocations WHERE expires_at < ?", (expires_at - 13 * 3600,))
            db.execute("INSERT OR IGNORE INTO token_revocations (tenant_id, token_id, expires_at) VALUES (?, ?, ?)",
                       (tenant_id, token_id, expires_at))

    def token_revoked(self, tenant_id: str, token_id: str, now: float) -> bool:
        row = self.db.connect().execute(
            "SELECT 1 FROM token_revocations WHERE tenant_id = ? AND token_id = ? AND expires_at > ?",
            (tenant_id, token_id, now)).fetchone()
        return row is not None

    def set_not_before(self, subject: str, when: float) -> None:
        with self.db.connect() as db:
            db.execute("INSERT INTO not_before (subject, at) VALUES (?, ?)"
                       " ON CONFLICT(subject) DO UPDATE SET at = max(at, excluded.at)", (subject, when))

    def not_before(self, subject: str) -> float | None:
        row = self.db.connect().execute("SELECT at FROM not_before WHERE subject = ?", (subject,)).fetchone()
        return None if row is None else row["at"]


def _migrate(db: sqlite3.Connection) -> None:
    """Columns added after a store file was created (make up keeps .local/gateway.db)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(tenants)")}
    if "catalog_only" not in columns:
        db.execute("ALTER TABLE tenants ADD COLUMN catalog_only INTEGER NOT NULL DEFAULT 0")
    if "limits" not in columns:
        db.execute("ALTER TABLE tenants ADD COLUMN limits TEXT")
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'revoked_tokens'").fetchone():
        # Revocations were keyed by token id alone; they are per tenant now.
        db.execute("INSERT OR IGNORE INTO token_revocations SELECT tenant_id, token_id, expires_at FROM revoked_tokens")
        db.execute("DROP TABLE revoked_tokens")


def _json_or_null(values: tuple[str, ...] | None) -> str | None:
    return None if values is None else json.dumps(list(values))


def _tuple_or_none(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(json.loads(text))


def _api_key(row: sqlite3.Row) -> ApiKeyRecord:
    return ApiKeyRecord(
        key_id=row["key_id"], tenant_id=row["tenant_id"], key_hash=row["key_hash"], scopes=tuple(json.loads(row["scopes"])),
        models=_tuple_or_none(row["models"]), created_at=row["created_at"], expires_at=row["expires_at"],
        revoked_at=row["revoked_at"], last_used_at=row["last_used_at"], name=row["name"],
    )
