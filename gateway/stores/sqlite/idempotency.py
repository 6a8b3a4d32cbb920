"""Idempotent requests' claims and replies in SQLite."""

from __future__ import annotations

from gateway.decisions.idempotency import Entry
from gateway.stores.sqlite.database import Database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    tenant_id   TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    reply       BLOB,
    expires_at  REAL NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
"""


class SQLiteIdempotency:
    def __init__(self, db: Database) -> None:
        self.db = db
        db.create(_SCHEMA)

    def claim_request(self, tenant_id: str, key: str, fingerprint: str, until: float, now: float) -> Entry | None:
        with self.db.connect() as db:
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
        with self.db.connect() as db:
            db.execute("UPDATE idempotency SET reply = ?, expires_at = ? WHERE tenant_id = ? AND key = ?"
                       " AND fingerprint = ? AND reply IS NULL", (reply, until, tenant_id, key, fingerprint))

    def drop_request(self, tenant_id: str, key: str, fingerprint: str) -> None:
        with self.db.connect() as db:
            db.execute("DELETE FROM idempotency WHERE tenant_id = ? AND key = ? AND fingerprint = ? AND reply IS NULL",
                       (tenant_id, key, fingerprint))
