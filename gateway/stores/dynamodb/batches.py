"""Batch files, uploads, batches and their ledgers in AWS: items in one DynamoDB table, bytes in S3.

The table (`BatchesTable` in template.yaml; `create_batches_table` makes it for tests):

    pk              sk            what
    T#<tenant>      F#<file id>   a file (its bytes: S3 files/<tenant hash>/<file id>)
    T#<tenant>      U#<upload>    an upload (its parts' bytes: S3 parts/<tenant hash>/<upload>/<part>)
    U#<upload>      P#<part>      a part of an upload
    B#<batch>       batch         a batch (its tenant an attribute): document, status, lease, turn, counts
    L#<batch>       <number>      a line of its ledger (a body or reply too large for an item: S3 ledger/<batch>/...)

Sparse indexes: `by_time` (a tenant's files, or its batches, in time order: `listing` is
"<tenant>#F" or "<tenant>#B"), `open` (batches not yet final), `expiring` (files and pending
uploads by expiry, for the sweep) and `waiting` (a ledger's lines not done, in file order, with
their `not_before` alone: a line is read from the table itself).

Indexes are eventually consistent: they only ever find candidates, and every decision is made
on a consistent read of the table (a line taken is re-read and taken by a conditional write; a
batch is complete when its counts say so, `gateway.batches.worker`). DynamoDB's TTL removes what
the sweep may miss, and an expired file is refused from the moment it expires, whatever TTL's
lag. A file's bytes are in S3 before its item names them, and its item goes before its bytes.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, replace
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
from gateway.stores.dynamodb.items import Table, index, item, ttl_of, typed

PART_BYTES = 8 * 1024 * 1024  # an S3 multipart upload's parts (S3 takes 5 MiB at least, but for the last)
SPILL_BYTES = 150 * 1024  # a line's body or reply past this goes to S3: both at most, an item stays under 400 KB
LINE_TTL_S = 7 * 86400  # a ledger outlives its batch's window by this much, should nothing drop it
_NANO = 1_000_000_000
_COUNTS = ("completed", "failed", "input_tokens", "output_tokens", "cached_tokens", "cost_nano")
_OPEN = {"IndexName": "open", "KeyConditionExpression": "#o = :o", "ExpressionAttributeNames": {"#o": "open"},
         "ExpressionAttributeValues": {":o": {"S": "open"}}}


class DynamoDBBatches:
    def __init__(self, dynamodb: Any, s3: Any, table: str, bucket: str, *, clock: Callable[[], float] = time.time) -> None:
        self.table = Table(dynamodb, table)
        self.s3 = s3
        self.bucket = bucket
        self.clock = clock

    # -- bytes ------------------------------------------------------------------------

    @staticmethod
    def _key(kind: str, tenant_id: str, *names: str) -> str:
        """An object's key: built only from ids this store gave out, the tenant by its hash."""
        return "/".join((kind, tenant_hash(tenant_id), *names))

    def _write(self, key: str, content: Iterable[bytes]) -> int:
        """The bytes under `key`, whole or not at all: one PUT for a small file, else a multipart
        upload of PART_BYTES parts, aborted when the content fails part way."""
        buffer, size, upload, parts = bytearray(), 0, None, []
        try:
            for chunk in content:
                buffer += chunk
                size += len(chunk)
                while len(buffer) >= PART_BYTES:
                    upload = upload or self.s3.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
                    parts.append(self._part(key, upload, len(parts) + 1, bytes(buffer[:PART_BYTES])))
                    del buffer[:PART_BYTES]
            if upload is None:
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=bytes(buffer))
                return size
            if buffer:
                parts.append(self._part(key, upload, len(parts) + 1, bytes(buffer)))
            self.s3.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
        except BaseException:
            if upload is not None:
                with contextlib.suppress(Exception):
                    self.s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
            raise
        return size

    def _part(self, key: str, upload: str, number: int, data: bytes) -> dict[str, Any]:
        reply = self.s3.upload_part(Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number, Body=data)
        return {"ETag": reply["ETag"], "PartNumber": number}

    def _read(self, key: str) -> Iterator[bytes] | None:
        """The object's bytes in pieces, or None when it is gone. Without s3:ListBucket (no role
        here has it) S3 answers a missing key AccessDenied, not NoSuchKey: both mean gone."""
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        except self.s3.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "AccessDenied", "404", "403"):
                return None
            raise

        def pieces() -> Iterator[bytes]:
            with contextlib.closing(body):
                yield from body.iter_chunks(1 << 20)

        return pieces()

    def _delete_objects(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects' maximum
            chunk = [{"Key": key} for key in keys[start:start + 1000]]
            self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})

    # -- files ------------------------------------------------------------------------

    def put_file(self, file: StoredFile, content: Iterable[bytes]) -> StoredFile:
        stored = replace(file, bytes=self._write(self._key("files", file.tenant_id, file.id), content))
        self.table.put(_file_item(stored))
        return stored

    def get_file(self, tenant_id: str, file_id: str) -> StoredFile | None:
        found = self.table.get({"pk": f"T#{tenant_id}", "sk": f"F#{file_id}"})
        return None if found is None or self._expired(found) else _file(found)

    def _expired(self, found: dict[str, Any]) -> bool:
        return found.get("expires_at") is not None and found["expires_at"] <= self.clock()

    def list_files(self, tenant_id: str, purpose: str | None, after: str | None, limit: int,
                   descending: bool, scopes: Iterable[str] | None = None) -> list[StoredFile]:
        allowed = None if scopes is None else set(scopes)
        chosen = []
        for found in self._in_time_order(tenant_id, "F", after, descending):
            if (purpose is not None and found["purpose"] != purpose) or self._expired(found):
                continue
            if allowed is not None and found.get("scope") is not None and found["scope"] not in allowed:
                continue
            chosen.append(_file(found))
            if len(chosen) == limit:
                break
        return chosen

    def _in_time_order(self, tenant_id: str, kind: str, after: str | None, descending: bool) -> Iterator[dict[str, Any]]:
        """A tenant's files (F) or batches (B) in time order (`by_time`), after the one named `after`."""
        listing = f"{tenant_id}#{kind}"
        condition, values = "listing = :l", {":l": typed(listing)}
        if after is not None:
            cursor = self.table.get({"pk": f"T#{tenant_id}", "sk": f"F#{after}"} if kind == "F" else
                                    {"pk": f"B#{after}", "sk": "batch"})
            if cursor is None or cursor["listing"] != listing:  # another tenant's id: an empty page
                return
            condition += f" AND #at {'<' if descending else '>'} :at"
            values[":at"] = typed(cursor["at"])
        extra = {"ExpressionAttributeNames": {"#at": "at"}} if after is not None else {}
        yield from self.table.query_pages(IndexName="by_time", KeyConditionExpression=condition,
                                          ExpressionAttributeValues=values, ScanIndexForward=not descending, **extra)

    def read_file(self, tenant_id: str, file_id: str) -> Iterator[bytes] | None:
        if self.get_file(tenant_id, file_id) is None:
            return None
        return self._read(self._key("files", tenant_id, file_id))

    def delete_file(self, tenant_id: str, file_id: str) -> bool:
        reply = self.table.delete({"pk": f"T#{tenant_id}", "sk": f"F#{file_id}"}, ReturnValues="ALL_OLD")
        if "Attributes" not in reply:
            return False  # no such file: no key is made of an id this store never gave out
        self.s3.delete_object(Bucket=self.bucket, Key=self._key("files", tenant_id, file_id))
        return True

    def holdings(self, tenant_id: str) -> tuple[int, int]:
        """From the tenant's file and upload items (at most MAX_TENANT_FILES of them): sort keys
        from "F#" up to "U$", the first key past every "U#..."."""
        size = count = 0
        for found in self.table.query_pages(KeyConditionExpression="pk = :pk AND sk BETWEEN :from AND :to",
                                            ExpressionAttributeValues={":pk": typed(f"T#{tenant_id}"),
                                                                       ":from": typed("F#"), ":to": typed("U$")},
                                            ProjectionExpression="sk, #b, expires_at, #s", ConsistentRead=True,
                                            ExpressionAttributeNames={"#b": "bytes", "#s": "status"}):
            upload = found["sk"].startswith("U#")  # a pending one counts until the sweep expires it
            if (upload and found.get("status") != "pending") or (not upload and self._expired(found)):
                continue
            size, count = size + int(found["bytes"]), count + 1
        return size, count

    def delete_expired(self, now: float) -> int:
        """Files and pending uploads past their expiry (the `expiring` index); ended batches and
        their ledgers go by `drop_lines` and TTL."""
        gone = 0
        for found in self._expiring("file", now):
            gone += self.delete_file(found["pk"].removeprefix("T#"), found["sk"].removeprefix("F#"))
        for found in self._expiring("upload", now):
            upload = Upload(**json.loads(found["document"]))
            gone += self.set_upload(replace(upload, status="expired"), "pending")
        return gone

    def _expiring(self, kind: str, now: float) -> list[dict[str, Any]]:
        return list(self.table.query_pages(IndexName="expiring", KeyConditionExpression="expiring = :k AND expires_at <= :now",
                                           ExpressionAttributeValues={":k": typed(kind), ":now": typed(now)}))

    # -- uploads ----------------------------------------------------------------------

    def put_upload(self, upload: Upload) -> None:
        self.table.put(_upload_item(upload), ConditionExpression="attribute_not_exists(pk)")

    def get_upload(self, tenant_id: str, upload_id: str) -> Upload | None:
        found = self.table.get({"pk": f"T#{tenant_id}", "sk": f"U#{upload_id}"})
        return None if found is None else Upload(**json.loads(found["document"]))

    def set_upload(self, upload: Upload, expect: str) -> bool:
        try:
            self.table.put(_upload_item(upload), ConditionExpression="#s = :expect",
                           ExpressionAttributeNames={"#s": "status"}, ExpressionAttributeValues={":expect": typed(expect)})
        except self.table.refused:
            return False
        if upload.status != "pending":
            self._drop_parts(upload)  # a cancelled or expired upload's parts are of no use
        return True

    def add_part(self, upload: Upload, part: UploadPart, data: bytes) -> None:
        self._write(self._key("parts", upload.tenant_id, upload.id, part.id), [data])
        self.table.put({"pk": f"U#{upload.id}", "sk": f"P#{part.id}", "bytes": part.bytes, "created_at": part.created_at,
                        "ttl": ttl_of(upload.expires_at + 86400)})

    def parts(self, upload_id: str) -> list[UploadPart]:
        found = self.table.query_pages(KeyConditionExpression="pk = :pk", ConsistentRead=True,
                                       ExpressionAttributeValues={":pk": typed(f"U#{upload_id}")})
        parts = [UploadPart(f["sk"].removeprefix("P#"), upload_id, int(f["bytes"]), f["created_at"]) for f in found]
        return sorted(parts, key=lambda p: (p.created_at, p.id))

    def read_parts(self, upload: Upload, part_ids: list[str]) -> Iterator[bytes]:
        for part_id in part_ids:
            pieces = self._read(self._key("parts", upload.tenant_id, upload.id, part_id))
            if pieces is None:
                raise ValueError(f"the part {part_id} is gone")
            yield from pieces

    def complete_upload(self, upload: Upload, part_ids: list[str], file: StoredFile, md5: str | None = None) -> StoredFile:
        key = self._key("files", file.tenant_id, file.id)
        parts = Digested(self.read_parts(upload, part_ids))
        stored = replace(file, bytes=self._write(key, parts))
        if not parts.matches(md5):
            self.s3.delete_object(Bucket=self.bucket, Key=key)
            raise DigestMismatch("the parts' md5 is not the one given")
        done = replace(upload, status="completed", file_id=file.id)
        completed = self.table.transact([  # the file and the upload's completion in one write
            {"Put": {"TableName": self.table.name, "Item": item(_upload_item(done)), "ConditionExpression": "#s = :p",
                     "ExpressionAttributeNames": {"#s": "status"}, "ExpressionAttributeValues": {":p": typed("pending")}}},
            {"Put": {"TableName": self.table.name, "Item": item(_file_item(stored))}}])
        if not completed:
            self.s3.delete_object(Bucket=self.bucket, Key=key)
            raise ValueError("the upload is no longer pending")
        self._drop_parts(upload)
        return stored

    def _drop_parts(self, upload: Upload) -> None:
        parts = self.parts(upload.id)
        self.table.batch_write([{"DeleteRequest": {"Key": item({"pk": f"U#{upload.id}", "sk": f"P#{p.id}"})}}
                                for p in parts])
        self._delete_objects([self._key("parts", upload.tenant_id, upload.id, p.id) for p in parts])

    # -- batches ----------------------------------------------------------------------

    def put_batch(self, batch: Batch) -> None:
        self.table.put({**_batch_item(batch), **dict.fromkeys(_COUNTS, 0)}, ConditionExpression="attribute_not_exists(pk)")

    def get_batch(self, tenant_id: str, batch_id: str) -> Batch | None:
        found = self.table.get(_batch_key(batch_id))
        return None if found is None or found["tenant"] != tenant_id else _batch(found)

    def list_batches(self, tenant_id: str, after: str | None, limit: int,
                     scopes: Iterable[str] | None = None) -> list[Batch]:
        allowed = None if scopes is None else set(scopes)
        chosen = []
        for found in self._in_time_order(tenant_id, "B", after, descending=True):
            if allowed is None or found["scope"] in allowed:
                batch = self.table.get({"pk": found["pk"], "sk": found["sk"]})  # the index holds none of its document
                if batch is not None:
                    chosen.append(_batch(batch))
                if len(chosen) == limit:
                    break
        return chosen

    def update_batch(self, batch: Batch, expect: str) -> bool:
        names, values, sets, removes = {}, {":expect": typed(expect)}, [], []
        for name, value in _batch_item(batch).items():
            if name in ("pk", "sk"):
                continue
            names[f"#{name}"] = name
            if value is None:
                removes.append(f"#{name}")
            else:
                values[f":{name}"] = typed(value)
                sets.append(f"#{name} = :{name}")
        if batch.status in FINAL:
            names["#open"] = "open"
            removes.append("#open")
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        try:
            self.table.update(_batch_key(batch.id), UpdateExpression=expression, ConditionExpression="#status = :expect",
                              ExpressionAttributeNames=names, ExpressionAttributeValues=values)
        except self.table.refused:
            return False
        return True

    def _open_items(self) -> Iterator[dict[str, Any]]:
        """Open batches' items: candidates from the `open` index (its keys alone: a batch's
        lease and counts change with every line, and an index holding them would be written
        as often), each read from the table as it stands now."""
        for found in self.table.query_pages(**_OPEN):
            now = self.table.get({"pk": found["pk"], "sk": found["sk"]})
            if now is not None and now["status"] not in FINAL:
                yield now

    def open_batches(self) -> list[Batch]:
        return [_batch(found) for found in self._open_items()]

    def stalled(self, now: float, quiet_s: float) -> list[Batch]:
        since = now - quiet_s
        return [_batch(f) for f in self._open_items()
                if max(f["created_at"], f.get("lease_until", 0), f.get("announced_at", 0)) <= since]

    def lease(self, batch_id: str, owner: str, until: float, now: float) -> bool:
        try:
            self.table.update(_batch_key(batch_id), UpdateExpression="SET lease_owner = :o, lease_until = :u",
                              ConditionExpression="attribute_exists(pk) AND (attribute_not_exists(lease_owner)"
                                                  " OR lease_owner = :o OR lease_until <= :now)",
                              ExpressionAttributeValues={":o": typed(owner), ":u": typed(until), ":now": typed(now)})
        except self.table.refused:
            return self.table.get(_batch_key(batch_id)) is None  # none (ended and gone): its worker reads that and stops
        return True

    def next_turn(self, batch_id: str, now: float) -> int | None:
        try:
            reply = self.table.update(_batch_key(batch_id), UpdateExpression="ADD turn :one SET announced_at = :now",
                                      ConditionExpression="attribute_exists(#open)", ExpressionAttributeNames={"#open": "open"},
                                      ExpressionAttributeValues={":one": typed(1), ":now": typed(now)},
                                      ReturnValues="UPDATED_NEW")
        except self.table.refused:
            return None
        return int(reply["Attributes"]["turn"]["N"])

    def turn_of(self, batch_id: str) -> int | None:
        found = self.table.get(_batch_key(batch_id))
        return None if found is None or "turn" not in found or "open" not in found else int(found["turn"])

    # -- the ledger -------------------------------------------------------------------

    def add_lines(self, batch: Batch, lines: list[Line], expect: str) -> bool:
        ttl = ttl_of(batch.expires_at + LINE_TTL_S)
        self.table.batch_write([{"PutRequest": {"Item": item(self._line_item(line, ttl))}} for line in lines])
        if self.update_batch(batch, expect):
            return True
        now = self.table.get(_batch_key(batch.id))
        if now is None or now["status"] != "in_progress":  # not a ledger another validator's batch runs on
            self.drop_lines(batch.id)
        return False

    def _line_item(self, line: Line, ttl: int) -> dict[str, Any]:
        values = {**_line_key(line), "custom_id": line.custom_id, "state": line.state, "decision_id": line.decision_id,
                  "tries": line.tries, "not_before": line.not_before, "failed": line.failed, "ttl": ttl,
                  "submission": line.submission, **self._texts(line, "body", line.body), **self._texts(line, "reply", line.reply)}
        if line.state != "done":
            values["waiting"] = values["sk"]
        return values

    def _texts(self, line: Line, name: str, text: str | None) -> dict[str, Any]:
        """The text as an attribute, or (one too large for an item) the key of the S3 object that
        holds it, in an attribute of its own (`<name>_s3`): a line's text is never read as a key."""
        if text is None or len(text.encode("utf-8", "surrogatepass")) <= SPILL_BYTES:
            return {name: text, f"{name}_s3": None}
        key = f"ledger/{line.batch_id}/{line.number}.{name}"
        self._write(key, [text.encode("utf-8", "surrogatepass")])
        return {name: None, f"{name}_s3": key}

    def _text(self, found: dict[str, Any], name: str) -> str | None:
        key = found.get(f"{name}_s3")
        if key is None:
            return found.get(name)
        pieces = self._read(key)
        return None if pieces is None else b"".join(pieces).decode("utf-8", "surrogatepass")

    def runnable_lines(self, batch_id: str, now: float, limit: int) -> list[Line]:
        """Candidates from the `waiting` index (their keys and `not_before`), each read from the
        table: one the index still lists though it was done is skipped."""
        runnable = []
        for found in self.table.query_pages(IndexName="waiting", KeyConditionExpression="pk = :pk",
                                            FilterExpression="not_before <= :now",
                                            ExpressionAttributeValues={":pk": typed(f"L#{batch_id}"), ":now": typed(now)}):
            line = self.table.get({"pk": found["pk"], "sk": found["sk"]})
            if line is not None and line["state"] != "done" and line["not_before"] <= now:  # as it stands now
                runnable.append(self._line(line))
                if len(runnable) == limit:
                    break
        return runnable

    def put_line(self, line: Line, expect_tries: int | None = None) -> bool:
        condition = "attribute_exists(pk) AND #st <> :done" + ("" if expect_tries is None else " AND tries = :t")
        values = {":done": typed("done")} | ({} if expect_tries is None else {":t": typed(expect_tries)})
        fields = {"#st": line.state, "tries": line.tries, "not_before": line.not_before, "failed": line.failed,
                  "decision_id": line.decision_id, "submission": line.submission,
                  **self._texts(line, "reply", line.reply)}
        try:
            self.table.update(_line_key(line), ConditionExpression=condition, ExpressionAttributeNames={"#st": "state"},
                              **_set_or_remove(fields, values))
        except self.table.refused:
            return False
        return True

    def get_line(self, batch_id: str, number: int) -> Line | None:
        found = self.table.get({"pk": f"L#{batch_id}", "sk": f"{number:09d}"})
        return None if found is None else self._line(found)

    def finish_line(self, line: Line, usage: LineUsage) -> None:
        fields = {"#st": "done", "tries": line.tries, "failed": line.failed, "decision_id": line.decision_id,
                  "waiting": None, **self._texts(line, "reply", line.reply)}
        counts = {":ok": int(not line.failed), ":bad": int(line.failed), ":in": usage.input_tokens,
                  ":out": usage.output_tokens, ":cached": usage.cached_tokens, ":nano": math.ceil(usage.cost_usd * _NANO)}
        # The line done and its batch's counts, in one write; a line done already is left as it is
        self.table.transact([
            {"Update": {"TableName": self.table.name, "Key": item(_line_key(line)),
                        "ConditionExpression": "attribute_exists(pk) AND #st <> :done",
                        "ExpressionAttributeNames": {"#st": "state"},
                        **_set_or_remove(fields, {":done": typed("done")})}},
            {"Update": {"TableName": self.table.name, "Key": item(_batch_key(line.batch_id)),
                        "UpdateExpression": "ADD completed :ok, failed :bad, input_tokens :in, output_tokens :out,"
                                            " cached_tokens :cached, cost_nano :nano",
                        "ConditionExpression": "attribute_exists(pk)",
                        "ExpressionAttributeValues": {k: typed(v) for k, v in counts.items()}}}])

    def drop_lines(self, batch_id: str) -> None:
        keys, spilled = [], []
        for found in self._ledger(batch_id):
            keys.append({"pk": found["pk"], "sk": found["sk"]})
            spilled += [found[k] for k in ("body_s3", "reply_s3") if found.get(k)]
        self.table.batch_write([{"DeleteRequest": {"Key": item(key)}} for key in keys])
        self._delete_objects(spilled)

    def unfinished_lines(self, batch_id: str) -> Iterator[Line]:
        return (self._line(f) for f in self._ledger(batch_id, "#st <> :done"))

    def finished_lines(self, batch_id: str) -> Iterator[Line]:
        return (self._line(f) for f in self._ledger(batch_id, "#st = :done"))

    def _ledger(self, batch_id: str, condition: str | None = None) -> Iterator[dict[str, Any]]:
        """The ledger's lines in file order, read consistently from the table (never the index)."""
        values = {":pk": typed(f"L#{batch_id}")}
        extra: dict[str, Any] = {}
        if condition is not None:
            values[":done"] = typed("done")
            extra = {"FilterExpression": condition, "ExpressionAttributeNames": {"#st": "state"}}
        return self.table.query_pages(KeyConditionExpression="pk = :pk", ExpressionAttributeValues=values,
                                      ConsistentRead=True, **extra)

    def _line(self, found: dict[str, Any]) -> Line:
        return Line(found["pk"].removeprefix("L#"), int(found["sk"]), found["custom_id"], self._text(found, "body") or "",
                    found["state"], found.get("decision_id"), int(found["tries"]), found["not_before"],
                    self._text(found, "reply"), bool(found["failed"]), found.get("submission"))


def _set_or_remove(fields: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """An UpdateExpression that sets the fields with a value and removes those without one."""
    sets, removes, values = [], [], dict(values)
    for number, (name, value) in enumerate(fields.items()):
        if value is None:
            removes.append(name)
        else:
            values[f":v{number}"] = typed(value)
            sets.append(f"{name} = :v{number}")
    expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
    return {"UpdateExpression": expression, "ExpressionAttributeValues": values}


def _file_item(file: StoredFile) -> dict[str, Any]:
    values = {"pk": f"T#{file.tenant_id}", "sk": f"F#{file.id}", "listing": f"{file.tenant_id}#F",
              "at": _at(file.created_at, file.id), "filename": file.filename, "purpose": file.purpose,
              "bytes": file.bytes, "created_at": file.created_at, "scope": file.scope}
    if file.expires_at is not None:
        values.update(expires_at=file.expires_at, expiring="file", ttl=ttl_of(file.expires_at + 86400))
    return values


def _file(found: dict[str, Any]) -> StoredFile:
    return StoredFile(found["sk"].removeprefix("F#"), found["pk"].removeprefix("T#"), found["filename"], found["purpose"],
                      int(found["bytes"]), found["created_at"], found.get("expires_at"), found.get("scope"))


def _upload_item(upload: Upload) -> dict[str, Any]:
    values = {"pk": f"T#{upload.tenant_id}", "sk": f"U#{upload.id}", "status": upload.status, "bytes": upload.bytes,
              "expires_at": upload.expires_at, "document": json.dumps(asdict(upload)),
              "ttl": ttl_of(upload.expires_at + 86400)}
    if upload.status == "pending":
        values["expiring"] = "upload"
    return values


def _batch_key(batch_id: str) -> dict[str, Any]:
    return {"pk": f"B#{batch_id}", "sk": "batch"}


def _batch_item(batch: Batch) -> dict[str, Any]:
    values = {**_batch_key(batch.id), "tenant": batch.tenant_id, "listing": f"{batch.tenant_id}#B",
              "at": _at(batch.created_at, batch.id), "scope": ENDPOINTS[batch.endpoint].scope, "status": batch.status,
              "created_at": batch.created_at, "document": json.dumps(batch.document())}
    if batch.status in FINAL:
        values["ttl"] = ttl_of(batch.created_at + FILE_TTL_S)
    else:
        values["open"] = "open"
    return values


def _batch(found: dict[str, Any]) -> Batch:
    batch = Batch.from_document(json.loads(found["document"]))
    batch.completed, batch.failed = int(found.get("completed", 0)), int(found.get("failed", 0))
    batch.usage = {k: int(found.get(k, 0)) for k in ("input_tokens", "output_tokens", "cached_tokens")}
    batch.cost_usd = found.get("cost_nano", 0) / _NANO
    return batch


def _line_key(line: Line) -> dict[str, Any]:
    return {"pk": f"L#{line.batch_id}", "sk": f"{line.number:09d}"}


def _at(created_at: float, name: str) -> str:
    """A sort key in time order, the id breaking ties (as the SQLite store's ORDER BY created_at, id)."""
    return f"{created_at:020.6f}#{name}"


BATCH_INDEXES = (("by_time", "listing", "at"), ("open", "open", "at"), ("expiring", "expiring", "expires_at"),
                 ("waiting", "pk", "waiting"))
# What each index holds beside its keys: what its readers use and that changes rarely (a batch's
# item changes with every line: an index holding those attributes would be written as often).
PROJECTIONS = {"by_time": {"ProjectionType": "INCLUDE",
                           "NonKeyAttributes": ["filename", "purpose", "bytes", "created_at", "expires_at", "scope"]},
               "open": {"ProjectionType": "KEYS_ONLY"},
               "expiring": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["document"]},
               "waiting": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["not_before"]}}


def create_batches_table(client: Any, name: str) -> None:
    """For tests and local tools; in AWS the template creates it (BatchesTable)."""
    strings = ("pk", "sk", "listing", "at", "open", "expiring", "waiting")
    client.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[*({"AttributeName": a, "AttributeType": "S"} for a in strings),
                              {"AttributeName": "expires_at", "AttributeType": "N"}],
        GlobalSecondaryIndexes=[index(i, partition, sort, PROJECTIONS[i]) for i, partition, sort in BATCH_INDEXES])
    client.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"})
