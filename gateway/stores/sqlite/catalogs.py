"""Catalog versions in SQLite: never overwritten, one row per version. An entry's head is
its highest live version; a version replaced expires (`expires_at`), and the rows the
store has no TTL for are deleted as the entry is written again."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator

from gateway.catalogs.model import CatalogVersion
from gateway.catalogs.store import TooManyEntries, VersionTaken
from gateway.stores.sqlite.database import Database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS catalog_versions (
    tenant_id       TEXT NOT NULL,
    name            TEXT NOT NULL,
    version         INTEGER NOT NULL,
    content_hash    TEXT NOT NULL,
    content         TEXT NOT NULL,
    created_at      REAL NOT NULL,
    expires_at      REAL,
    enforcing_since INTEGER,
    refit           TEXT,
    PRIMARY KEY (tenant_id, name, version)
);
"""
# Files written before versions expired lack these columns.
_ADDED = {"expires_at": "REAL", "enforcing_since": "INTEGER", "refit": "TEXT"}
LEGACY_KEEP_S = 90 * 86400.0


class SQLiteCatalogs:
    def __init__(self, db: Database) -> None:
        self.db = db
        db.create(_SCHEMA)
        if "refit" in db.add_columns("catalog_versions", _ADDED):
            with db.connect() as conn:  # as every later write stores them
                conn.execute("UPDATE catalog_versions SET refit = json_extract(content, '$.learning.refit')")
                # A version already replaced expires as one replaced now would (the default retention).
                conn.execute("UPDATE catalog_versions SET expires_at = ? WHERE version < (SELECT max(version) FROM"
                             " catalog_versions m WHERE m.tenant_id = catalog_versions.tenant_id"
                             " AND m.name = catalog_versions.name)", (time.time() + LEGACY_KEEP_S,))

    def insert_catalog_version(self, version: CatalogVersion, *, replaces: int, expire: dict[int, float],
                               max_entries: int) -> None:
        with self.db.connect() as db:
            db.execute("BEGIN IMMEDIATE")  # the latest, the count and the write are one transaction
            latest = db.execute("SELECT max(version) FROM catalog_versions WHERE tenant_id = ? AND name = ?",
                                (version.tenant_id, version.name)).fetchone()[0]
            if (latest or 0) != replaces:
                raise VersionTaken(version.ref)
            if replaces == 0:
                count = self._count(db, version.tenant_id)
                if count >= max_entries:
                    raise TooManyEntries(count)
            try:
                db.execute(
                    "INSERT INTO catalog_versions (tenant_id, name, version, content_hash, content, created_at,"
                    " enforcing_since, refit) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (version.tenant_id, version.name, version.version, version.content_hash, version.content,
                     version.created_at, version.enforcing_since, version.refit))
            except sqlite3.IntegrityError:
                raise VersionTaken(version.ref) from None
            db.executemany("UPDATE catalog_versions SET expires_at = ? WHERE tenant_id = ? AND name = ? AND version = ?",
                           [(until, version.tenant_id, version.name, old) for old, until in expire.items()])

    def delete_catalog_versions(self, tenant_id: str, name: str, below: int, keep: Iterable[int]) -> int:
        kept = sorted(keep)
        marks = ", ".join("?" * len(kept))
        with self.db.connect() as db:
            # `marks` is placeholders only: every value is a bound parameter.
            cursor = db.execute(
                "DELETE FROM catalog_versions WHERE tenant_id = ? AND name = ?"  # noqa: S608
                f" AND ((version < ? AND version NOT IN ({marks})) OR expires_at <= ?)",
                (tenant_id, name, below, *kept, time.time()))
        return cursor.rowcount

    def extend_catalog_version(self, tenant_id: str, name: str, version: int, until: float) -> None:
        with self.db.connect() as db:
            db.execute("UPDATE catalog_versions SET expires_at = ? WHERE tenant_id = ? AND name = ? AND version = ?"
                       " AND expires_at < ?", (until, tenant_id, name, version, until))

    def get_catalog_version(self, tenant_id: str, name: str, version: int) -> CatalogVersion | None:
        row = self.db.connect().execute("SELECT * FROM catalog_versions WHERE tenant_id = ? AND name = ? AND version = ?"
                                        " AND (expires_at IS NULL OR expires_at > ?)",
                                        (tenant_id, name, version, time.time())).fetchone()
        return None if row is None else _catalog_version(row)

    def latest_catalog_version(self, tenant_id: str, name: str) -> CatalogVersion | None:
        row = self.db.connect().execute(
            "SELECT * FROM catalog_versions WHERE tenant_id = ? AND name = ? ORDER BY version DESC LIMIT 1", (tenant_id, name)
        ).fetchone()
        return None if row is None else _catalog_version(row)

    def list_catalog_versions(self, tenant_id: str, name: str, after: int = 0, limit: int | None = None
                              ) -> list[CatalogVersion]:
        rows = self.db.connect().execute("SELECT * FROM catalog_versions WHERE tenant_id = ? AND name = ? AND version > ?"
                                         " AND (expires_at IS NULL OR expires_at > ?) ORDER BY version LIMIT ?",
                                         (tenant_id, name, after, time.time(), -1 if limit is None else limit))
        return [_catalog_version(row) for row in rows]

    def list_catalog_tenants(self) -> Iterator[str]:
        rows = self.db.connect().execute("SELECT DISTINCT tenant_id FROM catalog_versions ORDER BY tenant_id").fetchall()
        return (row["tenant_id"] for row in rows)

    def due_refits(self, tenant_id: str, after: str, limit: int) -> list[str]:
        rows = self.db.connect().execute(
            "SELECT name FROM catalog_versions c WHERE tenant_id = ? AND name > ? AND refit = 'daily' AND version ="
            " (SELECT max(version) FROM catalog_versions WHERE tenant_id = c.tenant_id AND name = c.name)"
            " ORDER BY name LIMIT ?", (tenant_id, after, limit))
        return [row["name"] for row in rows]

    def count_catalogs(self, tenant_id: str) -> int:
        return self._count(self.db.connect(), tenant_id)

    @staticmethod
    def _count(db: sqlite3.Connection, tenant_id: str) -> int:
        return db.execute("SELECT count(DISTINCT name) FROM catalog_versions WHERE tenant_id = ?", (tenant_id,)).fetchone()[0]

    def list_catalogs(self, tenant_id: str, after: str = "", limit: int | None = None) -> list[CatalogVersion]:
        rows = self.db.connect().execute(
            "SELECT c.* FROM catalog_versions c JOIN (SELECT name, MAX(version) AS version FROM catalog_versions"
            " WHERE tenant_id = ? AND name > ? GROUP BY name) m ON c.name = m.name AND c.version = m.version"
            " WHERE c.tenant_id = ? ORDER BY c.name LIMIT ?", (tenant_id, after, tenant_id, -1 if limit is None else limit))
        return [_catalog_version(row) for row in rows]


def _catalog_version(row: sqlite3.Row) -> CatalogVersion:
    return CatalogVersion(row["tenant_id"], row["name"], row["version"], row["content_hash"], row["content"],
                          row["created_at"], row["expires_at"], row["enforcing_since"])
