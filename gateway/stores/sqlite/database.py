"""The one SQLite file the local stack's stores share.

WAL mode, a connection per thread. Every write is one transaction, so a crash never
leaves a half-written row; each store creates its own tables when it is built.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path


class Database:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()

    def connect(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=10, isolation_level=None if self.path == ":memory:" else "DEFERRED")
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA foreign_keys = ON")
            if self.path != ":memory:":
                db.execute("PRAGMA journal_mode = WAL")
            self._local.db = db
        return db

    def create(self, schema: str) -> None:
        """Create the tables of `schema` where they are missing (every statement IF NOT EXISTS)."""
        with self.connect() as db:
            db.executescript(schema)

    def add_columns(self, table: str, columns: dict[str, str]) -> set[str]:
        """Add the `columns` (name: type) that a file written by an earlier version lacks; the
        names added."""
        with self.connect() as db:
            present = {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns.items():
                if name not in present:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
        return set(columns) - present
