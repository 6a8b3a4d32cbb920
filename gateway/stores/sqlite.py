"""The embedded SQLite store of the local stack.

One file, WAL mode, a connection per thread. Every write is one transaction, so a
crash never leaves a half-written record.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.auth.store import ApiKeyRecord, PrincipalRule, Tenant, TenantLimits, UsageRow
from gateway.catalogs.model import CatalogVersion
from gateway.catalogs.store import VersionTaken
from gateway.decisions.idempotency import Entry
from gateway.decisions.records import ListedRecord, OutcomeTrains, check_record_item, record_item_bytes
from gateway.stores import Stores

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
CREATE TABLE IF NOT EXISTS catalog_versions (
    tenant_id    TEXT NOT NULL,
    name         TEXT NOT NULL,
    version      INTEGER NOT NULL,
    content_hash TEXT NOT NULL,
    content      TEXT NOT NULL,
    created_at   REAL NOT NULL,
    PRIMARY KEY (tenant_id, name, version)
);
CREATE TABLE IF NOT EXISTS records (
    tenant_id  TEXT NOT NULL,
    record_id  TEXT NOT NULL,
    created_at REAL NOT NULL,
    catalogs   TEXT NOT NULL,
    body       TEXT NOT NULL,
    outcome    TEXT,
    expires_at REAL NOT NULL,
    PRIMARY KEY (tenant_id, record_id)
);
CREATE INDEX IF NOT EXISTS records_by_time ON records(tenant_id, created_at);
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
CREATE TABLE IF NOT EXISTS counters (
    name       TEXT PRIMARY KEY,
    count      INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency (
    tenant_id   TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    reply       BLOB,
    expires_at  REAL NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE TABLE IF NOT EXISTS tallies (
    name       TEXT PRIMARY KEY,
    amount     INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS usage (
    tenant_id     TEXT NOT NULL,
    day           TEXT NOT NULL,
    entry         TEXT NOT NULL,
    requests      INTEGER NOT NULL,
    cost_nano_usd INTEGER NOT NULL,
    endpoint_ms   INTEGER NOT NULL,
    expires_at    REAL NOT NULL,
    PRIMARY KEY (tenant_id, day, entry)
);
CREATE TABLE IF NOT EXISTS places (
    name       TEXT NOT NULL,
    holder     TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (name, holder)
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
            _migrate(db)

    def stores(self) -> Stores:
        return Stores(tenants=self, catalogs=self, records=self, idempotency=self)

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
                "INSERT INTO tenants (tenant_id, name, created_at, catalog_only, limits) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(tenant_id) DO UPDATE SET name = excluded.name, catalog_only = excluded.catalog_only,"
                " limits = excluded.limits",
                (tenant.tenant_id, tenant.name, tenant.created_at, int(tenant.catalog_only), json.dumps(tenant.limits.as_json())),
            )

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        row = self._connect().execute("SELECT * FROM tenants WHERE tenant_id = ?", (tenant_id,)).fetchone()
        if row is None:
            return None
        limits = TenantLimits.from_json(json.loads(row["limits"]) if row["limits"] else None)
        return Tenant(row["tenant_id"], row["name"], row["created_at"], bool(row["catalog_only"]), limits)

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
            # What TTL does in DynamoDB: a new revocation expires within 12 h from now (the
            # longest a token lives), so one expiring 13 h before it is long past.
            db.execute("DELETE FROM token_revocations WHERE expires_at < ?", (expires_at - 13 * 3600,))
            db.execute("INSERT OR IGNORE INTO token_revocations (tenant_id, token_id, expires_at) VALUES (?, ?, ?)",
                       (tenant_id, token_id, expires_at))

    def token_revoked(self, tenant_id: str, token_id: str, now: float) -> bool:
        row = self._connect().execute("SELECT 1 FROM token_revocations WHERE tenant_id = ? AND token_id = ? AND expires_at > ?",
                                      (tenant_id, token_id, now)).fetchone()
        return row is not None

    def set_not_before(self, subject: str, when: float) -> None:
        with self._connect() as db:
            db.execute("INSERT INTO not_before (subject, at) VALUES (?, ?)"
                       " ON CONFLICT(subject) DO UPDATE SET at = max(at, excluded.at)", (subject, when))

    def not_before(self, subject: str) -> float | None:
        row = self._connect().execute("SELECT at FROM not_before WHERE subject = ?", (subject,)).fetchone()
        return None if row is None else row["at"]

    def count_within(self, name: str, limit: int, expires_at: float) -> bool:
        """Count one more against `name`, unless it reached `limit`: True when counted."""
        with self._connect() as db:
            db.execute("DELETE FROM counters WHERE expires_at < ?", (time.time(),))
            cursor = db.execute("INSERT INTO counters (name, count, expires_at) VALUES (?, 1, ?)"
                                " ON CONFLICT(name) DO UPDATE SET count = count + 1 WHERE count < ?", (name, expires_at, limit))
        return cursor.rowcount == 1

    def add_within(self, name: str, amount: int, limit: int | None, expires_at: float) -> bool:
        """Add `amount` to the tally unless it reached `limit`: one statement, so atomic."""
        with self._connect() as db:
            db.execute("DELETE FROM tallies WHERE expires_at < ?", (time.time(),))
            cursor = db.execute("INSERT INTO tallies (name, amount, expires_at) VALUES (?, ?, ?)"
                                " ON CONFLICT(name) DO UPDATE SET amount = amount + excluded.amount"
                                " WHERE ? IS NULL OR amount < ?", (name, amount, expires_at, limit, limit))
        return cursor.rowcount == 1

    def tally(self, name: str) -> int:
        with self._connect() as db:
            row = db.execute("SELECT amount FROM tallies WHERE name = ? AND expires_at >= ?", (name, time.time())).fetchone()
        return int(row["amount"]) if row is not None else 0

    def add_usage(self, tenant_id: str, row: UsageRow, expires_at: float) -> None:
        with self._connect() as db:
            db.execute("INSERT INTO usage (tenant_id, day, entry, requests, cost_nano_usd, endpoint_ms, expires_at)"
                       " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(tenant_id, day, entry) DO UPDATE SET"
                       " requests = requests + excluded.requests, cost_nano_usd = cost_nano_usd + excluded.cost_nano_usd,"
                       " endpoint_ms = endpoint_ms + excluded.endpoint_ms, expires_at = excluded.expires_at",
                       (tenant_id, row.day, row.entry, row.requests, row.cost_nano_usd, row.endpoint_ms, expires_at))

    def usage(self, tenant_id: str, first_day: str, last_day: str) -> list[UsageRow]:
        with self._connect() as db:
            rows = db.execute("SELECT day, entry, requests, cost_nano_usd, endpoint_ms FROM usage WHERE tenant_id = ?"
                              " AND day BETWEEN ? AND ? ORDER BY day, entry", (tenant_id, first_day, last_day)).fetchall()
        return [UsageRow(r["day"], r["entry"], r["requests"], r["cost_nano_usd"], r["endpoint_ms"]) for r in rows]

    def hold(self, name: str, holder: str, limit: int, expires_at: float, now: float) -> bool:
        """Take a place of `name` unless `limit` unexpired ones are held: one write transaction."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")  # the count and the insert see no other writer between them
            db.execute("DELETE FROM places WHERE name = ? AND expires_at <= ?", (name, now))
            (held,) = db.execute("SELECT count(*) FROM places WHERE name = ?", (name,)).fetchone()
            if held >= limit:
                return False
            db.execute("INSERT OR REPLACE INTO places (name, holder, expires_at) VALUES (?, ?, ?)",
                       (name, holder, expires_at))
        return True

    def release(self, name: str, holder: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM places WHERE name = ? AND holder = ?", (name, holder))

    # -- idempotent requests --------------------------------------------------------------

    def claim_request(self, tenant_id: str, key: str, fingerprint: str, until: float, now: float) -> Entry | None:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")  # the look-up and the claim see no other writer between them
            db.execute("DELETE FROM idempotency WHERE tenant_id = ? AND expires_at <= ?", (tenant_id, now))
            row = db.execute("SELECT fingerprint, reply FROM idempotency WHERE tenant_id = ? AND key = ?",
                             (tenant_id, key)).fetchone()
            if row is not None:
                return Entry(row["fingerprint"], row["reply"])
            db.execute("INSERT OR REPLACE INTO idempotency (tenant_id, key, fingerprint, reply, expires_at)"
                       " VALUES (?, ?, ?, NULL, ?)", (tenant_id, key, fingerprint, until))
        return None

    def finish_request(self, tenant_id: str, key: str, fingerprint: str, reply: bytes, until: float) -> None:
        with self._connect() as db:
            db.execute("UPDATE idempotency SET reply = ?, expires_at = ? WHERE tenant_id = ? AND key = ?"
                       " AND fingerprint = ? AND reply IS NULL", (reply, until, tenant_id, key, fingerprint))

    def drop_request(self, tenant_id: str, key: str, fingerprint: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM idempotency WHERE tenant_id = ? AND key = ? AND fingerprint = ? AND reply IS NULL",
                       (tenant_id, key, fingerprint))

    # -- catalogs -----------------------------------------------------------------------

    def insert_catalog_version(self, version: CatalogVersion) -> None:
        try:
            with self._connect() as db:
                db.execute(
                    "INSERT INTO catalog_versions (tenant_id, name, version, content_hash, content, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (version.tenant_id, version.name, version.version, version.content_hash, version.content, version.created_at),
                )
        except sqlite3.IntegrityError:
            raise VersionTaken(version.ref) from None

    def get_catalog_version(self, tenant_id: str, name: str, version: int) -> CatalogVersion | None:
        row = self._connect().execute("SELECT * FROM catalog_versions WHERE tenant_id = ? AND name = ? AND version = ?",
                                      (tenant_id, name, version)).fetchone()
        return None if row is None else _catalog_version(row)

    def latest_catalog_version(self, tenant_id: str, name: str) -> CatalogVersion | None:
        row = self._connect().execute(
            "SELECT * FROM catalog_versions WHERE tenant_id = ? AND name = ? ORDER BY version DESC LIMIT 1", (tenant_id, name)
        ).fetchone()
        return None if row is None else _catalog_version(row)

    def list_catalog_versions(self, tenant_id: str, name: str, after: int = 0, limit: int | None = None
                              ) -> list[CatalogVersion]:
        rows = self._connect().execute("SELECT * FROM catalog_versions WHERE tenant_id = ? AND name = ? AND version > ?"
                                       " ORDER BY version LIMIT ?", (tenant_id, name, after, -1 if limit is None else limit))
        return [_catalog_version(row) for row in rows]

    def list_catalog_tenants(self) -> list[str]:
        return [row["tenant_id"] for row in
                self._connect().execute("SELECT DISTINCT tenant_id FROM catalog_versions ORDER BY tenant_id")]

    def list_catalogs(self, tenant_id: str) -> list[CatalogVersion]:
        rows = self._connect().execute(
            "SELECT c.* FROM catalog_versions c JOIN (SELECT name, MAX(version) AS version FROM catalog_versions"
            " WHERE tenant_id = ? GROUP BY name) m ON c.name = m.name AND c.version = m.version WHERE c.tenant_id = ?"
            " ORDER BY c.name", (tenant_id, tenant_id))
        return [_catalog_version(row) for row in rows]

    # -- decision records ---------------------------------------------------------------

    def put_record(self, tenant_id: str, record_id: str, created_at: float, catalogs: list[str], body: dict[str, Any],
                   expires_at: float) -> None:
        text = json.dumps(body)
        check_record_item(record_item_bytes(tenant_id, record_id, catalogs, text), outcome=False)
        with self._connect() as db:
            db.execute("INSERT INTO records (tenant_id, record_id, created_at, catalogs, body, expires_at)"
                       " VALUES (?, ?, ?, ?, ?, ?)",
                       (tenant_id, record_id, created_at, " ".join(catalogs), text, expires_at))

    def get_record(self, tenant_id: str, record_id: str) -> dict[str, Any] | None:
        row = self._connect().execute("SELECT * FROM records WHERE tenant_id = ? AND record_id = ? AND expires_at > ?",
                                      (tenant_id, record_id, time.time())).fetchone()
        return None if row is None else _record(row)

    def set_outcome(self, tenant_id: str, record_id: str, outcome: dict[str, Any], *, keep_training: bool = False) -> bool:
        text = json.dumps(outcome)
        with self._connect() as db:
            # The body and catalogs never change once written: the figure holds until the update.
            row = db.execute("SELECT body, catalogs FROM records WHERE tenant_id = ? AND record_id = ? AND expires_at > ?",
                             (tenant_id, record_id, time.time())).fetchone()
            if row is None:
                return False
            check_record_item(record_item_bytes(tenant_id, record_id, row["catalogs"].split(), row["body"], text),
                              outcome=True)
            # The outcome that trains is checked in the update itself: another writer may have
            # attached one since the read above.
            cursor = db.execute("UPDATE records SET outcome = ? WHERE tenant_id = ? AND record_id = ? AND expires_at > ?"
                                " AND (? = 0 OR outcome IS NULL OR coalesce(json_extract(outcome, '$.trains'), 0) = 0)",
                                (text, tenant_id, record_id, time.time(), int(keep_training)))
            if cursor.rowcount == 0 and keep_training and db.execute(
                    "SELECT 1 FROM records WHERE tenant_id = ? AND record_id = ? AND json_extract(outcome, '$.trains') = 1",
                    (tenant_id, record_id)).fetchone():
                raise OutcomeTrains(record_id)
        return cursor.rowcount == 1

    def scan_records(self, tenant_id: str, *, catalog: str | None = None, since: float | None = None,
                     before: str | None = None) -> Iterator[ListedRecord]:
        # A record that does not match is read without its texts, but counted at their size,
        # as DynamoDB reads (and a page counts) the whole item.
        match, params = "1", []
        if catalog is not None:
            match += " AND instr(' ' || catalogs || ' ', ?) > 0"
            params.append(f" {catalog} ")
        if since is not None:
            match += " AND created_at >= ?"
            params.append(since)
        # `match` is built from the literal fragments above only; every value is a bound parameter.
        query = (f"SELECT record_id, ({match}) AS matches,"  # noqa: S608
                 " length(CAST(body AS BLOB)) + coalesce(length(CAST(outcome AS BLOB)), 0) AS size,"
                 f" CASE WHEN {match} THEN body END AS body, CASE WHEN {match} THEN outcome END AS outcome"
                 " FROM records WHERE tenant_id = ? AND expires_at > ?")
        params = [*params, *params, *params, tenant_id, time.time()]
        if before is not None:
            query += " AND record_id < ?"
            params.append(before)
        for row in self._connect().execute(query + " ORDER BY record_id DESC", params):
            yield ListedRecord(row["record_id"], row["size"], _record(row) if row["matches"] else None)


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


def _catalog_version(row: sqlite3.Row) -> CatalogVersion:
    return CatalogVersion(row["tenant_id"], row["name"], row["version"], row["content_hash"], row["content"], row["created_at"])


def _record(row: sqlite3.Row) -> dict[str, Any]:
    return {**json.loads(row["body"]), "outcome": None if row["outcome"] is None else json.loads(row["outcome"])}


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

