"""Batch files, uploads, batches and their ledgers in AWS: items in one DynamoDB table, bytes in S3.

The table (`BatchesTable` in template.yaml; `create_batches_table` makes it for tests):

    pk              sk            what
    T#<tenant>      F#<file id>   a file: its row (its bytes: S3 files/<tenant hash>/<file id>)
    T#<tenant>      U#<upload>    an upload (its parts' bytes: S3 parts/<tenant hash>/<upload>/<part>)
    U#<upload>      P#<part>      a part of an upload
    B#<batch>       batch         a batch (its tenant an attribute): its document, status, lease and counts
    L#<batch>       <number>      a line of its ledger (a body or reply too large for an item: S3 ledger/<batch>/...)

Sparse indexes: `by_time` (files and batches of a tenant in time order), `open` (batches not yet
final), `expiring` (files and pending uploads by expiry, for the sweep) and `waiting` (a
ledger's lines not done, in file order). DynamoDB's TTL removes what the sweep may miss; an
expired file is refused from the moment it expires, whatever TTL's lag. A file's bytes are in
S3 before its item names them, and its item goes before its bytes, so it is whole or absent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, replace
from typing import Any

from gateway.batches.model import ENDPOINTS, FILE_TTL_S, FINAL, Batch, Line, LineUsage, StoredFile, Upload, UploadPart
from gateway.stores.dynamodb.items import Table, item, ttl_of, typed

PART_BYTES = 8 * 1024 * 1024  # an S3 multipart upload's parts (S3 takes 5 MiB at least, but for the last)
SPILL_BYTES = 300 * 1024  # a line's body or reply larger than this goes to S3 (an item holds 400 KB in all)
LINE_TTL_S = 7 * 86400  # a ledger outlives its batch's window by this much, should the sweep miss it
_WRITE_BATCH = 25  # DynamoDB's BatchWriteItem maximum
_NANO = 1_000_000_000
_COUNTS = ("completed", "failed", "input_tokens", "output_tokens", "cached_tokens", "cost_nano")


class DynamoDBBatches:
    def __init__(self, dynamodb: Any, s3: Any, table: str, bucket: str, *, clock: Callable[[], float] = time.time) -> None:
        self.table = Table(dynamodb, table)
        self.s3 = s3
        self.bucket = bucket
        self.clock = clock

    # -- bytes ------------------------------------------------------------------------

    @staticmethod
    def _key(kind: str, tenant_id: str, *names: str) -> str:
        """An object's key: the tenant by a hash of its id, never the id (keys show in listings and logs)."""
        return "/".join((kind, hashlib.sha256(tenant_id.encode()).hexdigest()[:32], *names))

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
        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        except self.s3.exceptions.NoSuchKey:
            return None

        def pieces() -> Iterator[bytes]:
            with contextlib.closing(body):
                yield from body.iter_chunks(1 << 20)

        return pieces()

    def _delete_objects(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # DeleteObjects' maximum
            self.s3.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]], "Quiet": True}
            )

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

    def list_files(
        self,
        tenant_id: str,
        purpose: str | None,
        after: str | None,
        limit: int,
        descending: bool,
        scopes: Iterable[str] | None = None,
    ) -> list[StoredFile]:
        allowed = None if scopes is None else set(scopes)
        chosen = []
        for found in self._in_time_order(f"{tenant_id}#F", "F", tenant_id, after, descending):
            if (purpose is not None and found["purpose"] != purpose) or self._expired(found):
                continue
            if allowed is not None and found.get("scope") is not None and found["scope"] not in allowed:
                continue
            chosen.append(_file(found))
            if len(chosen) == limit:
                break
        return chosen

    def _in_time_order(
        self, owner: str, kind: str, tenant_id: str, after: str | None, descending: bool
    ) -> Iterator[dict[str, Any]]:
        """A tenant's files or batches in time order (the `by_time` index), after the one named `after`."""
        condition, values = "#o = :o", {":o": typed(owner)}
        if after is not None:
            key = {"pk": f"T#{tenant_id}", "sk": f"F#{after}"} if kind == "F" else {"pk": f"B#{after}", "sk": "batch"}
            cursor = self.table.get(key)
            if cursor is None or cursor["owner"] != owner:
                return
            condition += f" AND #t {'<' if descending else '>'} :t"
            values[":t"] = typed(cursor["at"])
        yield from self.table.query_pages(
            IndexName="by_time",
            KeyConditionExpression=condition,
            ExpressionAttributeNames={"#o": "owner", **({"#t": "at"} if after else {})},
            ExpressionAttributeValues=values,
            ScanIndexForward=not descending,
        )

    def read_file(self, tenant_id: str, file_id: str) -> Iterator[bytes] | None:
        if self.get_file(tenant_id, file_id) is None:
            return None
        return self._read(self._key("files", tenant_id, file_id))

    def delete_file(self, tenant_id: str, file_id: str) -> bool:
        reply = self.table.client.delete_item(
            TableName=self.table.name, Key=item({"pk": f"T#{tenant_id}", "sk": f"F#{file_id}"}), ReturnValues="ALL_OLD"
        )
        if "Attributes" not in reply:
            return False  # no such file: no key is made of an id this store never gave out
        self.s3.delete_object(Bucket=self.bucket, Key=self._key("files", tenant_id, file_id))
        return True

    def holdings(self, tenant_id: str) -> tuple[int, int]:
        """Read from the tenant's items (files and uploads: at most MAX_TENANT_FILES of them)."""
        size = count = 0
        for found in self.table.query_pages(
            KeyConditionExpression="pk = :pk AND sk BETWEEN :from AND :to",
            ExpressionAttributeValues={":pk": typed(f"T#{tenant_id}"), ":from": typed("F#"), ":to": typed("U$")},
            ProjectionExpression="sk, #b, expires_at, #s",
            ExpressionAttributeNames={"#b": "bytes", "#s": "status"},
        ):
            upload = found["sk"].startswith("U#")  # a pending one counts until the sweep expires it
            if (upload and found.get("status") != "pending") or (not upload and self._expired(found)):
                continue
            size, count = size + int(found["bytes"]), count + 1
        return size, count

    def delete_expired(self, now: float) -> int:
        """Files and pending uploads past their expiry (the `expiring` index); ended batches' ledgers
        and ended batches themselves go by TTL and `drop_lines`."""
        gone = 0
        for found in self._expiring("file", now):
            tenant_id, file_id = found["pk"].removeprefix("T#"), found["sk"].removeprefix("F#")
            self.delete_file(tenant_id, file_id)
            gone += 1
        for found in self._expiring("upload", now):
            upload = Upload(**json.loads(found["document"]))
            gone += self.set_upload(replace(upload, status="expired"), "pending")
        return gone

    def _expiring(self, kind: str, now: float) -> list[dict[str, Any]]:
        return list(
            self.table.query_pages(
                IndexName="expiring",
                KeyConditionExpression="expiring = :k AND expires_at <= :now",
                ExpressionAttributeValues={":k": typed(kind), ":now": typed(now)},
            )
        )

    # -- uploads ----------------------------------------------------------------------

    def put_upload(self, upload: Upload) -> None:
        self.table.put(_upload_item(upload), ConditionExpression="attribute_not_exists(pk)")

    def get_upload(self, tenant_id: str, upload_id: str) -> Upload | None:
        found = self.table.get({"pk": f"T#{tenant_id}", "sk": f"U#{upload_id}"})
        return None if found is None else Upload(**json.loads(found["document"]))

    def set_upload(self, upload: Upload, expect: str) -> bool:
        try:
            self.table.put(
                _upload_item(upload),
                ConditionExpression="#s = :expect",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={":expect": typed(expect)},
            )
        except self.table.refused:
            return False
        if upload.status != "pending":
            self._drop_parts(upload)  # a cancelled or expired upload's parts are of no use
        return True

    def add_part(self, upload: Upload, part: UploadPart, data: bytes) -> None:
        self._write(self._key("parts", upload.tenant_id, upload.id, part.id), [data])
        self.table.put(
            {
                "pk": f"U#{upload.id}",
                "sk": f"P#{part.id}",
                "bytes": part.bytes,
                "created_at": part.created_at,
                "ttl": ttl_of(upload.expires_at + 86400),
            }
        )

    def parts(self, upload_id: str) -> list[UploadPart]:
        found = self.table.query_pages(
            KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": typed(f"U#{upload_id}")}
        )
        parts = [UploadPart(f["sk"].removeprefix("P#"), upload_id, int(f["bytes"]), f["created_at"]) for f in found]
        return sorted(parts, key=lambda p: (p.created_at, p.id))

    def read_parts(self, upload: Upload, part_ids: list[str]) -> Iterator[bytes]:
        for part_id in part_ids:
            pieces = self._read(self._key("parts", upload.tenant_id, upload.id, part_id))
            if pieces is None:
                raise ValueError(f"the part {part_id} is gone")
            yield from pieces

    def complete_upload(self, upload: Upload, part_ids: list[str], file: StoredFile) -> StoredFile:
        key = self._key("files", file.tenant_id, file.id)
        stored = replace(file, bytes=self._write(key, self.read_parts(upload, part_ids)))
        done = replace(upload, status="completed", file_id=file.id)
        try:  # the file and the upload's completion in one write
            self.table.client.transact_write_items(
                TransactItems=[
                    {
                        "Put": {
                            "TableName": self.table.name,
                            "Item": item(_upload_item(done)),
                            "ConditionExpression": "#s = :p",
                            "ExpressionAttributeNames": {"#s": "status"},
                            "ExpressionAttributeValues": {":p": typed("pending")},
                        }
                    },
                    {"Put": {"TableName": self.table.name, "Item": item(_file_item(stored))}},
                ]
            )
        except self.table.client.exceptions.TransactionCanceledException:
            self.s3.delete_object(Bucket=self.bucket, Key=key)
            raise ValueError("the upload is no longer pending") from None
        self._drop_parts(upload)
        return stored

    def _drop_parts(self, upload: Upload) -> None:
        parts = self.parts(upload.id)
        self._delete_items([{"pk": f"U#{upload.id}", "sk": f"P#{p.id}"} for p in parts])
        self._delete_objects([self._key("parts", upload.tenant_id, upload.id, p.id) for p in parts])

    # -- batches ----------------------------------------------------------------------

    def put_batch(self, batch: Batch) -> None:
        values = {**_batch_item(batch), **dict.fromkeys(_COUNTS, 0)}
        self.table.put(values, ConditionExpression="attribute_not_exists(pk)")

    def get_batch(self, tenant_id: str, batch_id: str) -> Batch | None:
        found = self.table.get({"pk": f"B#{batch_id}", "sk": "batch"})
        return None if found is None or found["tenant"] != tenant_id else _batch(found)

    def list_batches(self, tenant_id: str, after: str | None, limit: int, scopes: Iterable[str] | None = None) -> list[Batch]:
        allowed = None if scopes is None else set(scopes)
        chosen = []
        for found in self._in_time_order(f"{tenant_id}#B", "B", tenant_id, after, descending=True):
            if allowed is None or found["scope"] in allowed:
                chosen.append(_batch(self.table.get({"pk": found["pk"], "sk": "batch"}) or found))  # counts as of now
                if len(chosen) == limit:
                    break
        return chosen

    def update_batch(self, batch: Batch, expect: str) -> bool:
        names, values, sets, removes = {"#s": "status"}, {":expect": typed(expect)}, [], []
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
            removes.append("#open")
            names["#open"] = "open"
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        try:
            self.table.update(
                _batch_key(batch),
                UpdateExpression=expression,
                ConditionExpression="#s = :expect",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except self.table.refused:
            return False
        return True

    def open_batches(self) -> list[Batch]:
        """From the `open` index (eventually consistent: a batch that has just ended may still be
        listed; its worker reads it again, consistently, and stops)."""
        found = self.table.query_pages(
            IndexName="open",
            KeyConditionExpression="#o = :o",
            ExpressionAttributeNames={"#o": "open"},
            ExpressionAttributeValues={":o": typed("open")},
        )
        return [batch for batch in map(_batch, found) if batch.status not in FINAL]

    def stalled(self, now: float, quiet_s: float) -> list[Batch]:
        found = self.table.query_pages(IndexName="open", KeyConditionExpression="#o = :o",
                                       ExpressionAttributeNames={"#o": "open"}, ExpressionAttributeValues={":o": typed("open")})
        since = now - quiet_s
        return [_batch(f) for f in found if f.get("lease_until", 0) <= since and f["created_at"] <= since]

    def lease(self, batch_id: str, owner: str, until: float, now: float) -> bool:
        try:
            self.table.update(
                {"pk": f"B#{batch_id}", "sk": "batch"},
                UpdateExpression="SET lease_owner = :o, lease_until = :u",
                ConditionExpression="attribute_exists(pk) AND (attribute_not_exists(lease_owner)"
                " OR lease_owner = :o OR lease_until <= :now)",
                ExpressionAttributeValues={":o": typed(owner), ":u": typed(until), ":now": typed(now)},
            )
        except self.table.refused:
            return not self._exists(batch_id)  # none (ended and gone): the worker reads that and stops
        return True

    def _exists(self, batch_id: str) -> bool:
        return self.table.get({"pk": f"B#{batch_id}", "sk": "batch"}) is not None

    # -- the ledger -------------------------------------------------------------------

    def add_lines(self, batch: Batch, lines: list[Line], expect: str) -> bool:
        """The lines first (a batch with no status change has no ledger anyone reads), then the
        batch's status from `expect`; should that fail, the lines are taken back."""
        ttl = ttl_of(batch.expires_at + LINE_TTL_S)
        puts = [self._line_item(line, ttl) for line in lines]
        self._write_items(puts)
        if self.update_batch(batch, expect):
            return True
        self.drop_lines(batch.id)
        return False

    def _line_item(self, line: Line, ttl: int) -> dict[str, Any]:
        values = {
            "pk": f"L#{line.batch_id}",
            "sk": f"{line.number:09d}",
            "custom_id": line.custom_id,
            "state": line.state,
            "decision_id": line.decision_id,
            "tries": line.tries,
            "not_before": line.not_before,
            "failed": line.failed,
            "ttl": ttl,
        }
        values["body"] = self._spilled(line, "body", line.body)
        values["reply"] = self._spilled(line, "reply", line.reply)
        if line.state != "done":
            values["waiting"] = values["sk"]
        return values

    def _spilled(self, line: Line, name: str, text: str | None) -> str | None:
        """The text, or (one too large for an item) a reference to the S3 object that holds it."""
        if text is None or len(text.encode("utf-8", "surrogatepass")) <= SPILL_BYTES:
            return text
        key = f"ledger/{line.batch_id}/{line.number}.{name}"
        self._write(key, [text.encode("utf-8", "surrogatepass")])
        return json.dumps({"s3": key})

    def _unspilled(self, text: str | None) -> str | None:
        if text is None or not text.startswith('{"s3": '):
            return text
        pieces = self._read(json.loads(text)["s3"])
        return None if pieces is None else b"".join(pieces).decode("utf-8", "surrogatepass")

    def runnable_lines(self, batch_id: str, now: float, limit: int) -> list[Line]:
        runnable = []
        for found in self._waiting(batch_id):
            if found["not_before"] <= now:
                runnable.append(self._line(found))
                if len(runnable) == limit:
                    break
        return runnable

    def _waiting(self, batch_id: str) -> Iterator[dict[str, Any]]:
        return self.table.query_pages(
            IndexName="waiting", KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": typed(f"L#{batch_id}")}
        )

    def put_line(self, line: Line, expect_tries: int | None = None) -> bool:
        condition = "attribute_exists(pk) AND #st <> :done" + ("" if expect_tries is None else " AND tries = :t")
        values = {
            ":done": typed("done"),
            ":state": typed(line.state),
            ":tries": typed(line.tries),
            ":nb": typed(line.not_before),
            ":failed": typed(line.failed),
        }
        if expect_tries is not None:
            values[":t"] = typed(expect_tries)
        sets = ["#st = :state", "tries = :tries", "not_before = :nb", "failed = :failed"]
        removes = []
        for name, value in (("decision_id", line.decision_id), ("reply", self._spilled(line, "reply", line.reply))):
            if value is None:
                removes.append(name)
            else:
                values[f":{name}"] = typed(value)
                sets.append(f"{name} = :{name}")
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        try:
            self.table.update(
                _line_key(line),
                UpdateExpression=expression,
                ConditionExpression=condition,
                ExpressionAttributeNames={"#st": "state"},
                ExpressionAttributeValues=values,
            )
        except self.table.refused:
            return False
        return True

    def finish_line(self, line: Line, usage: LineUsage) -> None:
        values = {
            ":done": typed("done"),
            ":tries": typed(line.tries),
            ":failed": typed(line.failed),
            ":ok": typed(int(not line.failed)),
            ":bad": typed(int(line.failed)),
            ":in": typed(usage.input_tokens),
            ":out": typed(usage.output_tokens),
            ":cached": typed(usage.cached_tokens),
            ":nano": typed(math.ceil(usage.cost_usd * _NANO)),
        }
        reply = self._spilled(line, "reply", line.reply)
        line_sets = "#st = :done, tries = :tries, failed = :failed" + (", reply = :reply" if reply is not None else "")
        line_values = {k: values[k] for k in (":done", ":tries", ":failed")}
        if reply is not None:
            line_values[":reply"] = typed(reply)
        if line.decision_id is not None:
            line_sets += ", decision_id = :d"
            line_values[":d"] = typed(line.decision_id)
        try:  # the line done and its batch's counts, in one write; a line done already is left as it is
            self.table.client.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": self.table.name,
                            "Key": item(_line_key(line)),
                            "UpdateExpression": f"SET {line_sets} REMOVE waiting",
                            "ConditionExpression": "attribute_exists(pk) AND #st <> :done",
                            "ExpressionAttributeNames": {"#st": "state"},
                            "ExpressionAttributeValues": line_values,
                        }
                    },
                    {
                        "Update": {
                            "TableName": self.table.name,
                            "Key": item({"pk": f"B#{line.batch_id}", "sk": "batch"}),
                            "UpdateExpression": "ADD completed :ok, failed :bad, input_tokens :in, output_tokens :out,"
                            " cached_tokens :cached, cost_nano :nano",
                            "ConditionExpression": "attribute_exists(pk)",
                            "ExpressionAttributeValues": {
                                k: values[k] for k in (":ok", ":bad", ":in", ":out", ":cached", ":nano")
                            },
                        }
                    },
                ]
            )
        except self.table.client.exceptions.TransactionCanceledException:
            return

    def drop_lines(self, batch_id: str) -> None:
        keys, spilled = [], []
        for found in self.table.query_pages(
            KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": typed(f"L#{batch_id}")}
        ):
            keys.append({"pk": found["pk"], "sk": found["sk"]})
            spilled += [
                json.loads(v)["s3"]
                for v in (found.get("body"), found.get("reply"))
                if isinstance(v, str) and v.startswith('{"s3": ')
            ]
        self._delete_items(keys)
        self._delete_objects(spilled)

    def unfinished_lines(self, batch_id: str) -> Iterator[Line]:
        return (self._line(found) for found in self._waiting(batch_id))

    def finished_lines(self, batch_id: str) -> Iterator[Line]:
        found = self.table.query_pages(
            KeyConditionExpression="pk = :pk",
            FilterExpression="#st = :done",
            ExpressionAttributeNames={"#st": "state"},
            ExpressionAttributeValues={":pk": typed(f"L#{batch_id}"), ":done": typed("done")},
        )
        return (self._line(f) for f in found)

    def _line(self, found: dict[str, Any]) -> Line:
        return Line(
            found["pk"].removeprefix("L#"),
            int(found["sk"]),
            found["custom_id"],
            self._unspilled(found["body"]) or "",
            found["state"],
            found.get("decision_id"),
            int(found["tries"]),
            found["not_before"],
            self._unspilled(found.get("reply")),
            bool(found["failed"]),
        )

    # -- writes in bulk ---------------------------------------------------------------

    def _write_items(self, puts: list[dict[str, Any]]) -> None:
        self._batch_write([{"PutRequest": {"Item": item(values)}} for values in puts])

    def _delete_items(self, keys: list[dict[str, Any]]) -> None:
        self._batch_write([{"DeleteRequest": {"Key": item(key)}} for key in keys])

    def _batch_write(self, requests: list[dict[str, Any]]) -> None:
        """All of `requests`, 25 at a time, those DynamoDB left unprocessed sent again."""
        for start in range(0, len(requests), _WRITE_BATCH):
            pending = requests[start : start + _WRITE_BATCH]
            for attempt in range(8):
                reply = self.table.client.batch_write_item(RequestItems={self.table.name: pending})
                pending = reply.get("UnprocessedItems", {}).get(self.table.name, [])
                if not pending:
                    break
                time.sleep(min(2.0, 0.05 * 2**attempt))
            else:
                raise RuntimeError("DynamoDB left writes unprocessed after 8 attempts")


def _file_item(file: StoredFile) -> dict[str, Any]:
    values = {
        "pk": f"T#{file.tenant_id}",
        "sk": f"F#{file.id}",
        "owner": f"{file.tenant_id}#F",
        "at": _at(file.created_at, file.id),
        "filename": file.filename,
        "purpose": file.purpose,
        "bytes": file.bytes,
        "created_at": file.created_at,
        "scope": file.scope,
    }
    if file.expires_at is not None:
        values.update(expires_at=file.expires_at, expiring="file", ttl=ttl_of(file.expires_at + 86400))
    return values


def _file(found: dict[str, Any]) -> StoredFile:
    return StoredFile(
        found["sk"].removeprefix("F#"),
        found["pk"].removeprefix("T#"),
        found["filename"],
        found["purpose"],
        int(found["bytes"]),
        found["created_at"],
        found.get("expires_at"),
        found.get("scope"),
    )


def _upload_item(upload: Upload) -> dict[str, Any]:
    values = {
        "pk": f"T#{upload.tenant_id}",
        "sk": f"U#{upload.id}",
        "status": upload.status,
        "bytes": upload.bytes,
        "expires_at": upload.expires_at,
        "document": json.dumps(asdict(upload)),
        "ttl": ttl_of(upload.expires_at + 86400),
    }
    if upload.status == "pending":
        values["expiring"] = "upload"
    return values


def _batch_key(batch: Batch) -> dict[str, Any]:
    return {"pk": f"B#{batch.id}", "sk": "batch"}


def _batch_item(batch: Batch) -> dict[str, Any]:
    values = {
        **_batch_key(batch),
        "tenant": batch.tenant_id,
        "owner": f"{batch.tenant_id}#B",
        "at": _at(batch.created_at, batch.id),
        "scope": ENDPOINTS[batch.endpoint].scope,
        "status": batch.status,
        "created_at": batch.created_at,
        "document": json.dumps(batch.document()),
    }
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


def create_batches_table(client: Any, name: str) -> None:
    """For tests and local tools; in AWS the template creates it (BatchesTable)."""
    strings = ("pk", "sk", "owner", "at", "open", "expiring", "waiting")
    client.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            *({"AttributeName": a, "AttributeType": "S"} for a in strings),
            {"AttributeName": "expires_at", "AttributeType": "N"},
        ],
        GlobalSecondaryIndexes=[_index(name, partition, sort) for name, partition, sort in BATCH_INDEXES],
    )
    client.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"})


BATCH_INDEXES = (
    ("by_time", "owner", "at"),
    ("open", "open", "at"),
    ("expiring", "expiring", "expires_at"),
    ("waiting", "pk", "waiting"),
)


def _index(name: str, partition: str, sort: str) -> dict[str, Any]:
    return {
        "IndexName": name,
        "Projection": {"ProjectionType": "ALL"},
        "KeySchema": [{"AttributeName": partition, "KeyType": "HASH"}, {"AttributeName": sort, "KeyType": "RANGE"}],
    }
