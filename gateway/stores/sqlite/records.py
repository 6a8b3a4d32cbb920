"""Decision records in SQLite, held to the item limit DynamoDB would hold them to."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

from gateway.decisions.records import ListedRecord, OutcomeTrains, check_record_item, record_item_bytes
from gateway.stores.sqlite.database import Database

_SCHEMA = """
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
"""


class SQLiteRecords:
    def __init__(self, db: Database) -> None:
        self.db = db
        db.create(_SCHEMA)

    def put_record(self, tenant_id: str, record_id: str, created_at: float, catalogs: list[str], body: dict[str, Any],
                   expires_at: float) -> int:
        text = json.dumps(body)
        size = record_item_bytes(tenant_id, record_id, catalogs, text)
        check_record_item(size, outcome=False)
        with self.db.connect() as db:
            db.execute("INSERT INTO records (tenant_id, record_id, created_at, catalogs, body, expires_at)"
                       " VALUES (?, ?, ?, ?, ?, ?)",
                       (tenant_id, record_id, created_at, " ".join(catalogs), text, expires_at))
        return size

    def get_record(self, tenant_id: str, record_id: str) -> dict[str, Any] | None:
        row = self.db.connect().execute("SELECT * FROM records WHERE tenant_id = ? AND record_id = ? AND expires_at > ?",
                                        (tenant_id, record_id, time.time())).fetchone()
        return None if row is None else _record(row)

    def set_outcome(self, tenant_id: str, record_id: str, outcome: dict[str, Any], *, keep_training: bool = False) -> bool:
        text = json.dumps(outcome)
        with self.db.connect() as db:
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
        for row in self.db.connect().execute(query + " ORDER BY record_id DESC", params):
            yield ListedRecord(row["record_id"], row["size"], _record(row) if row["matches"] else None)


def _record(row: sqlite3.Row) -> dict[str, Any]:
    return {**json.loads(row["body"]), "outcome": None if row["outcome"] is None else json.loads(row["outcome"])}
