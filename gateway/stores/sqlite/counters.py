"""The counters shared by every request of the local stack, in SQLite: rate windows,
tallies, usage by day and places in flight. Each change is one statement or one
immediate transaction, so two processes on one file never both take the last place."""

from __future__ import annotations

import time

from gateway.auth.store import USAGE_FIGURES, UsageRow
from gateway.stores.sqlite.database import Database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS counters (
    name       TEXT PRIMARY KEY,
    count      INTEGER NOT NULL,
    expires_at REAL NOT NULL
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
    stored_bytes  INTEGER NOT NULL DEFAULT 0,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
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


# The figures added since the first schema (every one from stored_bytes on): an older file gets their columns.
ADDED_FIGURES = USAGE_FIGURES[USAGE_FIGURES.index("stored_bytes"):]
# Built once from the figures' names (constants of the code, never input), so a figure added to
# UsageRow is written and read without another copy of the list here.
_ADD_USAGE = (f"INSERT INTO usage (tenant_id, day, entry, {', '.join(USAGE_FIGURES)}, expires_at)"  # noqa: S608
              f" VALUES (?, ?, ?, {', '.join('?' * len(USAGE_FIGURES))}, ?) ON CONFLICT(tenant_id, day, entry)"
              f" DO UPDATE SET {', '.join(f'{c} = {c} + excluded.{c}' for c in USAGE_FIGURES)},"
              " expires_at = excluded.expires_at")
_READ_USAGE = (f"SELECT day, entry, {', '.join(USAGE_FIGURES)} FROM usage"  # noqa: S608
               " WHERE tenant_id = ? AND day BETWEEN ? AND ? ORDER BY day, entry")


class SQLiteCounters:
    def __init__(self, db: Database) -> None:
        self.db = db
        db.create(_SCHEMA)
        db.add_columns("usage", {column: "INTEGER NOT NULL DEFAULT 0" for column in ADDED_FIGURES})  # a file from before them

    def count_within(self, name: str, limit: int, expires_at: float) -> bool:
        with self.db.connect() as db:
            db.execute("DELETE FROM counters WHERE expires_at < ?", (time.time(),))
            cursor = db.execute("INSERT INTO counters (name, count, expires_at) VALUES (?, 1, ?)"
                                " ON CONFLICT(name) DO UPDATE SET count = count + 1 WHERE count < ?", (name, expires_at, limit))
        return cursor.rowcount == 1

    def add_within(self, name: str, amount: int, limit: int | None, expires_at: float) -> bool:
        with self.db.connect() as db:
            db.execute("DELETE FROM tallies WHERE expires_at < ?", (time.time(),))
            cursor = db.execute("INSERT INTO tallies (name, amount, expires_at) VALUES (?, ?, ?)"
                                " ON CONFLICT(name) DO UPDATE SET amount = amount + excluded.amount"
                                " WHERE ? IS NULL OR amount < ?", (name, amount, expires_at, limit, limit))
        return cursor.rowcount == 1

    def tally(self, name: str) -> int:
        with self.db.connect() as db:
            row = db.execute("SELECT amount FROM tallies WHERE name = ? AND expires_at >= ?", (name, time.time())).fetchone()
        return int(row["amount"]) if row is not None else 0

    def add_usage(self, tenant_id: str, row: UsageRow, expires_at: float) -> None:
        with self.db.connect() as db:
            db.execute(_ADD_USAGE, (tenant_id, row.day, row.entry, *(getattr(row, c) for c in USAGE_FIGURES), expires_at))

    def usage(self, tenant_id: str, first_day: str, last_day: str) -> list[UsageRow]:
        with self.db.connect() as db:
            rows = db.execute(_READ_USAGE, (tenant_id, first_day, last_day)).fetchall()
        return [UsageRow(r["day"], r["entry"], **{c: r[c] for c in USAGE_FIGURES}) for r in rows]

    def hold(self, name: str, holder: str, limit: int, expires_at: float, now: float) -> bool:
        with self.db.connect() as db:
            db.execute("BEGIN IMMEDIATE")  # the count and the insert see no other writer between them
            db.execute("DELETE FROM places WHERE name = ? AND expires_at <= ?", (name, now))
            (held,) = db.execute("SELECT count(*) FROM places WHERE name = ?", (name,)).fetchone()
            if held >= limit:
                return False
            db.execute("INSERT OR REPLACE INTO places (name, holder, expires_at) VALUES (?, ?, ?)",
                       (name, holder, expires_at))
        return True

    def release(self, name: str, holder: str) -> None:
        with self.db.connect() as db:
            db.execute("DELETE FROM places WHERE name = ? AND holder = ?", (name, holder))
