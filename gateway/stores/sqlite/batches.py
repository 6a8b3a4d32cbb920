"""Batch files, uploads, batches and their ledgers: rows in SQLite, bytes in a folder beside it.

A file's bytes are written to a temporary name (0600: the tenant's data, readable by this
user alone) and renamed into place before the row that names them is written, so a file is
whole or absent; deleting removes the row first. The folder is `<database>.files/`, one
sub-folder per tenant (a hash of its id, never the id).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from gateway.batches.model import (
    ENDPOINTS,
    FILE_TTL_S,
    FINAL,
    Batch,
    Digested,
    DigestMismatch,
    Line,
    LineUsage,
    StoredFile,
    Upload,
    UploadPart,
    tenant_hash,
)
from gateway.stores.sqlite.database import Database

_OPEN = f"status NOT IN ({', '.join(repr(status) for status in sorted(FINAL))})"  # its index's WHERE, word for word
_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_files (
    tenant_id  TEXT NOT NULL,
    id         TEXT NOT NULL,
    filename   TEXT NOT NULL,
    purpose    TEXT NOT NULL,
    bytes      INTEGER NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL,
    scope      TEXT,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX IF NOT EXISTS batch_files_by_time ON batch_files (tenant_id, created_at, id);
CREATE TABLE IF NOT EXISTS batch_uploads (
    tenant_id TEXT NOT NULL,
    id        TEXT NOT NULL,
    status    TEXT NOT NULL,
    document  TEXT NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE TABLE IF NOT EXISTS batch_upload_parts (
    upload_id  TEXT NOT NULL,
    id         TEXT NOT NULL,
    tenant_id  TEXT NOT NULL,
    bytes      INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (upload_id, id)
);
CREATE TABLE IF NOT EXISTS batches (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL,
    scope         TEXT NOT NULL,
    status        TEXT NOT NULL,
    created_at    REAL NOT NULL,
    document      TEXT NOT NULL,
    lease_owner   TEXT,
    lease_until   REAL NOT NULL DEFAULT 0,
    completed     INTEGER NOT NULL DEFAULT 0,
    failed        INTEGER NOT NULL DEFAULT 0,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    cost_nano     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches (tenant_id, created_at, id);
CREATE INDEX IF NOT EXISTS batches_open ON batches (created_at) WHERE {open};
CREATE TABLE IF NOT EXISTS batch_lines (
    batch_id    TEXT NOT NULL,
    number      INTEGER NOT NULL,
    custom_id   TEXT NOT NULL,
    body        TEXT NOT NULL,
    state       TEXT NOT NULL,
    decision_id TEXT,
    tries       INTEGER NOT NULL,
    not_before  REAL NOT NULL,
    reply       TEXT,
    failed      INTEGER NOT NULL,
    submission  TEXT,
    PRIMARY KEY (batch_id, number)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS batch_lines_open ON batch_lines (batch_id, number) WHERE state != 'done';
""".replace("{open}", _OPEN)
_LINE_COLUMNS = "batch_id, number, custom_id, body, state, decision_id, tries, not_before, reply, failed, submission"
_PUT_LINE = ("UPDATE batch_lines SET state = ?, decision_id = ?, tries = ?, not_before = ?, reply = ?, failed = ?,"
             " submission = ?"
             " WHERE batch_id = ? AND number = ? AND state != 'done'")
_PAGE = 1000  # lines read at a time when a ledger is read in order
_NANO = 1_000_000_000


class SQLiteBatches:
    def __init__(self, db: Database, folder: str | Path | None = None) -> None:
        self.db = db
        db.create(_SCHEMA)
        db.add_columns("batches", {"turn": "INTEGER", "announced_at": "REAL NOT NULL DEFAULT 0"})  # a file from before turns
        db.add_columns("batch_lines", {"submission": "TEXT"})  # a file from before asynchronous pools
        if folder is None:
            folder = tempfile.mkdtemp(prefix="batch-files-") if db.path == ":memory:" else f"{db.path}.files"
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    # -- bytes ------------------------------------------------------------------------

    def _path(self, tenant_id: str, name: str) -> Path:
        return self.folder / tenant_hash(tenant_id) / name

    def _write(self, path: Path, content: Iterable[bytes]) -> int:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".writing-")  # created 0600
        size = 0
        try:
            with os.fdopen(descriptor, "wb") as out:
                for chunk in content:
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        return size

    @staticmethod
    def _read(path: Path, piece: int = 1 << 20) -> Iterator[bytes]:
        with path.open("rb") as source:
            while chunk := source.read(piece):
                yield chunk

    # -- files ------------------------------------------------------------------------

    def put_file(self, file: StoredFile, content: Iterable[bytes]) -> StoredFile:
        stored = replace(file, bytes=self._write(self._path(file.tenant_id, file.id), content))
        with self.db.connect() as db:
            _insert_file(db, stored)
        return stored

    def get_file(self, tenant_id: str, file_id: str) -> StoredFile | None:
        row = self.db.connect().execute("SELECT * FROM batch_files WHERE tenant_id = ? AND id = ?",
                                        (tenant_id, file_id)).fetchone()
        return None if row is None else _file(row)

    def list_files(self, tenant_id: str, purpose: str | None, after: str | None, limit: int,
                   descending: bool, scopes: Iterable[str] | None = None) -> list[StoredFile]:
        db = self.db.connect()
        where, params = ["tenant_id = ?"], [tenant_id]
        if scopes is not None:
            where.append(f"(scope IS NULL OR scope IN ({', '.join('?' * len(scopes := sorted(scopes)))}))")
            params.extend(scopes)
        if purpose is not None:
            where.append("purpose = ?")
            params.append(purpose)
        if after is not None:
            row = db.execute("SELECT created_at FROM batch_files WHERE tenant_id = ? AND id = ?",
                             (tenant_id, after)).fetchone()
            if row is None:
                return []
            where.append(f"(created_at, id) {'<' if descending else '>'} (?, ?)")
            params.extend([row["created_at"], after])
        order = "DESC" if descending else "ASC"
        rows = db.execute(f"SELECT * FROM batch_files WHERE {' AND '.join(where)}"  # noqa: S608 - fixed fragments
                          f" ORDER BY created_at {order}, id {order} LIMIT ?", (*params, limit)).fetchall()
        return [_file(row) for row in rows]

    def read_file(self, tenant_id: str, file_id: str) -> Iterator[bytes] | None:
        if self.get_file(tenant_id, file_id) is None:
            return None
        path = self._path(tenant_id, file_id)
        return self._read(path) if path.exists() else None

    def delete_file(self, tenant_id: str, file_id: str) -> bool:
        with self.db.connect() as db:
            deleted = db.execute("DELETE FROM batch_files WHERE tenant_id = ? AND id = ?", (tenant_id, file_id)).rowcount
        with contextlib.suppress(FileNotFoundError):
            self._path(tenant_id, file_id).unlink()
        return bool(deleted)

    def holdings(self, tenant_id: str) -> tuple[int, int]:
        db = self.db.connect()
        files = db.execute("SELECT COALESCE(SUM(bytes), 0), COUNT(*) FROM batch_files WHERE tenant_id = ?",
                           (tenant_id,)).fetchone()
        pending = db.execute("SELECT COALESCE(SUM(json_extract(document, '$.bytes')), 0), COUNT(*) FROM batch_uploads"
                             " WHERE tenant_id = ? AND status = 'pending'", (tenant_id,)).fetchone()
        return int(files[0]) + int(pending[0]), int(files[1]) + int(pending[1])

    def delete_expired(self, now: float) -> int:
        """Files past their expiry, uploads past theirs (with their parts), ended batches' ledgers,
        and ended batches older than a file is kept: how many went."""
        db = self.db.connect()
        with db:
            db.execute(f"DELETE FROM batch_lines WHERE batch_id IN (SELECT id FROM batches WHERE NOT ({_OPEN}))")  # noqa: S608
            db.execute(f"DELETE FROM batches WHERE NOT ({_OPEN}) AND created_at <= ?", (now - FILE_TTL_S,))  # noqa: S608
        files = db.execute("SELECT tenant_id, id FROM batch_files WHERE expires_at <= ?", (now,)).fetchall()
        for row in files:
            self.delete_file(row["tenant_id"], row["id"])
        uploads = [Upload(**json.loads(row["document"])) for row in
                   db.execute("SELECT document FROM batch_uploads WHERE status = 'pending'").fetchall()]
        expired = [u for u in uploads if u.expires_at <= now]
        for upload in expired:
            self.set_upload(replace(upload, status="expired"), "pending")
        return len(files) + len(expired)

    # -- uploads ----------------------------------------------------------------------

    def put_upload(self, upload: Upload) -> None:
        with self.db.connect() as db:
            db.execute("INSERT INTO batch_uploads (tenant_id, id, status, document) VALUES (?, ?, ?, ?)",
                       (upload.tenant_id, upload.id, upload.status, json.dumps(_fields(upload))))

    def get_upload(self, tenant_id: str, upload_id: str) -> Upload | None:
        row = self.db.connect().execute("SELECT document FROM batch_uploads WHERE tenant_id = ? AND id = ?",
                                        (tenant_id, upload_id)).fetchone()
        return None if row is None else Upload(**json.loads(row["document"]))

    def set_upload(self, upload: Upload, expect: str) -> bool:
        with self.db.connect() as db:
            changed = bool(db.execute("UPDATE batch_uploads SET status = ?, document = ? WHERE tenant_id = ? AND id = ?"
                                      " AND status = ?", (upload.status, json.dumps(_fields(upload)), upload.tenant_id,
                                                          upload.id, expect)).rowcount)
        if changed and upload.status != "pending":
            self._drop_parts(upload)  # a cancelled or expired upload's parts are of no use
        return changed

    def add_part(self, upload: Upload, part: UploadPart, data: bytes) -> None:
        self._write(self._path(upload.tenant_id, f"{upload.id}.{part.id}"), [data])
        with self.db.connect() as db:
            db.execute("INSERT INTO batch_upload_parts (upload_id, id, tenant_id, bytes, created_at) VALUES (?, ?, ?, ?, ?)",
                       (upload.id, part.id, upload.tenant_id, part.bytes, part.created_at))

    def parts(self, upload_id: str) -> list[UploadPart]:
        rows = self.db.connect().execute("SELECT id, upload_id, bytes, created_at FROM batch_upload_parts"
                                         " WHERE upload_id = ? ORDER BY created_at, id", (upload_id,)).fetchall()
        return [UploadPart(row["id"], row["upload_id"], row["bytes"], row["created_at"]) for row in rows]

    def read_parts(self, upload: Upload, part_ids: list[str]) -> Iterator[bytes]:
        for part_id in part_ids:
            yield from self._read(self._path(upload.tenant_id, f"{upload.id}.{part_id}"))

    def complete_upload(self, upload: Upload, part_ids: list[str], file: StoredFile, md5: str | None = None) -> StoredFile:
        parts = Digested(self.read_parts(upload, part_ids))
        stored = replace(file, bytes=self._write(self._path(file.tenant_id, file.id), parts))
        if not parts.matches(md5):
            self._path(file.tenant_id, file.id).unlink(missing_ok=True)
            raise DigestMismatch("the parts' md5 is not the one given")
        done = replace(upload, status="completed", file_id=file.id)
        with self.db.connect() as db:  # the file and the upload's completion in one write
            db.execute("BEGIN IMMEDIATE")
            if not db.execute("UPDATE batch_uploads SET status = ?, document = ? WHERE tenant_id = ? AND id = ?"
                              " AND status = 'pending'", ("completed", json.dumps(_fields(done)), upload.tenant_id,
                                                          upload.id)).rowcount:
                db.rollback()
                self._path(file.tenant_id, file.id).unlink(missing_ok=True)
                raise ValueError("the upload is no longer pending")
            _insert_file(db, stored)
        self._drop_parts(upload)
        return stored

    def _drop_parts(self, upload: Upload) -> None:
        with self.db.connect() as db:
            ids = [row["id"] for row in db.execute("SELECT id FROM batch_upload_parts WHERE upload_id = ?", (upload.id,))]
            db.execute("DELETE FROM batch_upload_parts WHERE upload_id = ?", (upload.id,))
        for part_id in ids:
            self._path(upload.tenant_id, f"{upload.id}.{part_id}").unlink(missing_ok=True)

    # -- batches ----------------------------------------------------------------------

    def put_batch(self, batch: Batch) -> None:
        with self.db.connect() as db:
            db.execute("INSERT INTO batches (id, tenant_id, scope, status, created_at, document) VALUES (?, ?, ?, ?, ?, ?)",
                       (batch.id, batch.tenant_id, ENDPOINTS[batch.endpoint].scope, batch.status, batch.created_at,
                        json.dumps(batch.document())))

    def get_batch(self, tenant_id: str, batch_id: str) -> Batch | None:
        row = self.db.connect().execute("SELECT * FROM batches WHERE tenant_id = ? AND id = ?",
                                        (tenant_id, batch_id)).fetchone()
        return None if row is None else _batch(row)

    def list_batches(self, tenant_id: str, after: str | None, limit: int,
                     scopes: Iterable[str] | None = None) -> list[Batch]:
        db = self.db.connect()
        where, params = "tenant_id = ?", [tenant_id]
        if scopes is not None:
            where += f" AND scope IN ({', '.join('?' * len(scopes := sorted(scopes)))})"
            params.extend(scopes)
        if after is not None:
            row = db.execute("SELECT created_at FROM batches WHERE tenant_id = ? AND id = ?", (tenant_id, after)).fetchone()
            if row is None:
                return []
            where += " AND (created_at, id) < (?, ?)"
            params.extend([row["created_at"], after])
        rows = db.execute(f"SELECT * FROM batches WHERE {where} ORDER BY created_at DESC, id DESC LIMIT ?",  # noqa: S608
                          (*params, limit)).fetchall()
        return [_batch(row) for row in rows]

    def update_batch(self, batch: Batch, expect: str) -> bool:
        with self.db.connect() as db:
            return bool(db.execute("UPDATE batches SET status = ?, document = ? WHERE id = ? AND status = ?",
                                   (batch.status, json.dumps(batch.document()), batch.id, expect)).rowcount)

    def open_batches(self) -> list[Batch]:
        rows = self.db.connect().execute(f"SELECT * FROM batches WHERE {_OPEN} ORDER BY created_at").fetchall()  # noqa: S608
        return [_batch(row) for row in rows]

    def stalled(self, now: float, quiet_s: float) -> list[Batch]:
        since = now - quiet_s
        rows = self.db.connect().execute(f"SELECT * FROM batches WHERE {_OPEN} AND MAX(created_at, lease_until,"  # noqa: S608
                                         " announced_at) <= ? ORDER BY created_at", (since,)).fetchall()
        return [_batch(row) for row in rows]

    def next_turn(self, batch_id: str, now: float) -> int | None:
        with self.db.connect() as db:  # one transaction: the turn read is the one written
            db.execute("BEGIN IMMEDIATE")
            if not db.execute(f"UPDATE batches SET turn = COALESCE(turn, 0) + 1, announced_at = ? WHERE id = ? AND {_OPEN}",  # noqa: S608
                              (now, batch_id)).rowcount:
                return None
            return db.execute("SELECT turn FROM batches WHERE id = ?", (batch_id,)).fetchone()["turn"]

    def turn_of(self, batch_id: str) -> int | None:
        row = self.db.connect().execute(f"SELECT turn FROM batches WHERE id = ? AND {_OPEN}", (batch_id,)).fetchone()  # noqa: S608
        return None if row is None else row["turn"]

    def lease(self, batch_id: str, owner: str, until: float, now: float) -> bool:
        with self.db.connect() as db:
            if db.execute("UPDATE batches SET lease_owner = ?, lease_until = ? WHERE id = ? AND"
                          " (lease_owner IS NULL OR lease_owner = ? OR lease_until <= ?)",
                          (owner, until, batch_id, owner, now)).rowcount:
                return True
            # None to hold (ended and gone): its worker reads that and stops
            return db.execute("SELECT 1 FROM batches WHERE id = ?", (batch_id,)).fetchone() is None

    # -- the ledger -------------------------------------------------------------------

    def add_lines(self, batch: Batch, lines: list[Line], expect: str) -> bool:
        with self.db.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            if not db.execute("UPDATE batches SET status = ?, document = ? WHERE id = ? AND status = ?",
                              (batch.status, json.dumps(batch.document()), batch.id, expect)).rowcount:
                db.rollback()
                return False
            db.executemany(f"INSERT OR REPLACE INTO batch_lines ({_LINE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                           [_line_row(line) for line in lines])
        return True

    def runnable_lines(self, batch_id: str, now: float, limit: int) -> list[Line]:
        rows = self.db.connect().execute(f"SELECT {_LINE_COLUMNS} FROM batch_lines WHERE batch_id = ? AND state != 'done'"  # noqa: S608
                                         " AND not_before <= ? ORDER BY number LIMIT ?", (batch_id, now, limit)).fetchall()
        return [_line(row) for row in rows]

    def put_line(self, line: Line, expect_tries: int | None = None) -> bool:
        condition, extra = ("", ()) if expect_tries is None else (" AND tries = ?", (expect_tries,))
        with self.db.connect() as db:
            return bool(db.execute(
                _PUT_LINE + condition,
                (line.state, line.decision_id, line.tries, line.not_before, line.reply, int(line.failed),
                 line.submission, line.batch_id, line.number, *extra)).rowcount)

    def get_line(self, batch_id: str, number: int) -> Line | None:
        row = self.db.connect().execute(f"SELECT {_LINE_COLUMNS} FROM batch_lines WHERE batch_id = ? AND number = ?",  # noqa: S608
                                        (batch_id, number)).fetchone()
        return None if row is None else _line(row)

    def finish_line(self, line: Line, usage: LineUsage) -> None:
        with self.db.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            if not db.execute("UPDATE batch_lines SET state = 'done', decision_id = ?, tries = ?, reply = ?, failed = ?"
                              " WHERE batch_id = ? AND number = ? AND state != 'done'",
                              (line.decision_id, line.tries, line.reply, int(line.failed), line.batch_id,
                               line.number)).rowcount:
                db.rollback()
                return
            db.execute("UPDATE batches SET completed = completed + ?, failed = failed + ?, input_tokens = input_tokens + ?,"
                       " output_tokens = output_tokens + ?, cached_tokens = cached_tokens + ?, cost_nano = cost_nano + ?"
                       " WHERE id = ?", (int(not line.failed), int(line.failed), usage.input_tokens, usage.output_tokens,
                                         usage.cached_tokens, math.ceil(usage.cost_usd * _NANO), line.batch_id))

    def drop_lines(self, batch_id: str) -> None:
        with self.db.connect() as db:
            db.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))

    def unfinished_lines(self, batch_id: str) -> Iterator[Line]:
        return self._lines(batch_id, "state != 'done'")

    def finished_lines(self, batch_id: str) -> Iterator[Line]:
        return self._lines(batch_id, "state = 'done'")

    def _lines(self, batch_id: str, condition: str) -> Iterator[Line]:
        after = -1
        while True:
            rows = self.db.connect().execute(
                f"SELECT {_LINE_COLUMNS} FROM batch_lines WHERE batch_id = ? AND {condition} AND number > ?"  # noqa: S608
                " ORDER BY number LIMIT ?", (batch_id, after, _PAGE)).fetchall()
            yield from (_line(row) for row in rows)
            if len(rows) < _PAGE:
                return
            after = rows[-1]["number"]


def _fields(upload: Upload) -> dict[str, Any]:
    return asdict(upload)


def _insert_file(db: sqlite3.Connection, file: StoredFile) -> None:
    db.execute("INSERT OR REPLACE INTO batch_files (tenant_id, id, filename, purpose, bytes, created_at, expires_at,"
               " scope) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (file.tenant_id, file.id, file.filename, file.purpose,
                                                          file.bytes, file.created_at, file.expires_at, file.scope))


def _file(row: sqlite3.Row) -> StoredFile:
    return StoredFile(row["id"], row["tenant_id"], row["filename"], row["purpose"], row["bytes"], row["created_at"],
                      row["expires_at"], row["scope"])


def _batch(row: sqlite3.Row) -> Batch:
    batch = Batch.from_document(json.loads(row["document"]))
    batch.completed, batch.failed = row["completed"], row["failed"]
    batch.usage = {"input_tokens": row["input_tokens"], "output_tokens": row["output_tokens"],
                   "cached_tokens": row["cached_tokens"]}
    batch.cost_usd = row["cost_nano"] / _NANO
    return batch


def _line_row(line: Line) -> tuple:
    return (line.batch_id, line.number, line.custom_id, line.body, line.state, line.decision_id, line.tries,
            line.not_before, line.reply, int(line.failed), line.submission)


def _line(row: sqlite3.Row) -> Line:
    return Line(row["batch_id"], row["number"], row["custom_id"], row["body"], row["state"], row["decision_id"],
                row["tries"], row["not_before"], row["reply"], bool(row["failed"]), row["submission"])
