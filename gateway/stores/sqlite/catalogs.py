"""Catalog versions in SQLite: never overwritten, one row per version."""

from __future__ import annotations

import sqlite3

from gateway.catalogs.model import CatalogVersion
from gateway.catalogs.store import VersionTaken
from gateway.stores.sqlite.database import Database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS catalog_versions (
    tenant_id    TEXT NOT NULL,
    name         TEXT NOT NULL,
    version      INTEGER NOT NULL,
    content_hash TEXT NOT NULL,
    content      TEXT NOT NULL,
    created_at   REAL NOT NULL,
    PRIMARY KEY (tenant_id, name, version)
);
"""


class SQLiteCatalogs:
    def __init__(self, db: Database) -> None:
        self.db = db
        db.create(_SCHEMA)

    def insert_catalog_version(self, version: CatalogVersion) -> None:
        try:
            with self.db.connect() as db:
                db.execute(
                    "INSERT INTO catalog_versions (tenant_id, name, version, content_hash, content, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (version.tenant_id, version.name, version.version, version.content_hash, version.content, version.created_at),
                )
        except sqlite3.IntegrityError:
            raise VersionTaken(version.ref) from None

    def get_catalog_version(self, tenant_id: str, name: str, version: int) -> CatalogVersion | None:
        row = self.db.connect().execute("SELECT * FROM catalog_versions WHERE tenant_id = ? AND name = ? AND version = ?",
                                        (tenant_id, name, version)).fetchone()
        return None if row is None else _catalog_version(row)

    def latest_catalog_version(self, tenant_id: str, name: str) -> CatalogVersion | None:
        row = self.db.connect().execute(
            "SELECT * FROM catalog_versions WHERE tenant_id = ? AND name = ? ORDER BY version DESC LIMIT 1", (tenant_id, name)
        ).fetchone()
        return None if row is None else _catalog_version(row)

    def list_catalog_versions(self, tenant_id: str, name: str, after: int = 0, limit: int | None = None
                              ) -> list[CatalogVersion]:
        rows = self.db.connect().execute("SELECT * FROM catalog_versions WHERE tenant_id = ? AND name = ? AND version > ?"
                                         " ORDER BY version LIMIT ?", (tenant_id, name, after, -1 if limit is None else limit))
        return [_catalog_version(row) for row in rows]

    def list_catalog_tenants(self) -> list[str]:
        return [row["tenant_id"] for row in
                self.db.connect().execute("SELECT DISTINCT tenant_id FROM catalog_versions ORDER BY tenant_id")]

    def list_catalogs(self, tenant_id: str) -> list[CatalogVersion]:
        rows = self.db.connect().execute(
            "SELECT c.* FROM catalog_versions c JOIN (SELECT name, MAX(version) AS version FROM catalog_versions"
            " WHERE tenant_id = ? GROUP BY name) m ON c.name = m.name AND c.version = m.version WHERE c.tenant_id = ?"
            " ORDER BY c.name", (tenant_id, tenant_id))
        return [_catalog_version(row) for row in rows]


def _catalog_version(row: sqlite3.Row) -> CatalogVersion:
    return CatalogVersion(row["tenant_id"], row["name"], row["version"], row["content_hash"], row["content"], row["created_at"])
