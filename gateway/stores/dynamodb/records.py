"""Decision records in DynamoDB: partition `tenant_id`, sort key `record_id` (time-ordered
ids), expired by TTL. `item_bytes` is what the record takes before its outcome
(`record_item_bytes`), so that attaching an outcome is held to the item limit by the
write's own condition, with no read. A record is written only where none is."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from gateway.decisions.records import (
    MAX_RECORD_ITEM_BYTES,
    ListedRecord,
    OutcomeTrains,
    RecordTooLarge,
    check_record_item,
    record_item_bytes,
)
from gateway.stores.dynamodb.items import Table, plain, typed


class DynamoDBRecords:
    def __init__(self, client: Any, records_table: str) -> None:
        self.table = Table(client, records_table)

    def put_record(self, tenant_id: str, record_id: str, created_at: float, catalogs: list[str], body: dict[str, Any],
                   expires_at: float) -> int:
        text = json.dumps(body)
        size = record_item_bytes(tenant_id, record_id, catalogs, text)
        check_record_item(size, outcome=False)
        values = {"tenant_id": tenant_id, "record_id": record_id, "created_at": created_at, "catalogs": catalogs or None,
                  "body": text, "ttl": int(expires_at), "expires_at": expires_at, "item_bytes": size}
        try:
            self.table.put(values, ConditionExpression="attribute_not_exists(record_id)")
        except self.table.client.exceptions.ClientError as exc:
            if _item_too_large(exc):  # DynamoDB counted more than record_item_bytes: still the caller's 413
                raise RecordTooLarge(None, outcome=False) from exc
            raise
        return size

    def get_record(self, tenant_id: str, record_id: str) -> dict[str, Any] | None:
        found = self._live_record(tenant_id, record_id)
        return None if found is None else _record(found)

    def _live_record(self, tenant_id: str, record_id: str) -> dict[str, Any] | None:
        found = self.table.get({"tenant_id": tenant_id, "record_id": record_id})
        return found if found is not None and found["expires_at"] > time.time() else None  # TTL deletion lags; expiry does not

    def set_outcome(self, tenant_id: str, record_id: str, outcome: dict[str, Any], *, keep_training: bool = False) -> bool:
        text = json.dumps(outcome)
        room = MAX_RECORD_ITEM_BYTES - len(text.encode("utf-8", "surrogatepass"))
        # Records written before item_bytes are held to the limit by DynamoDB itself (below).
        condition = ("attribute_exists(record_id) AND expires_at > :now"
                     " AND (attribute_not_exists(item_bytes) OR item_bytes <= :room)")
        values = {":o": {"S": text}, ":now": typed(time.time()), ":room": typed(room),
                  ":trains": typed(bool(outcome.get("trains")))}
        if keep_training:
            condition += " AND (attribute_not_exists(outcome_trains) OR outcome_trains = :no)"
            values[":no"] = typed(False)
        try:
            self.table.update({"tenant_id": tenant_id, "record_id": record_id},
                              UpdateExpression="SET outcome = :o, outcome_trains = :trains", ConditionExpression=condition,
                              ExpressionAttributeValues=values)
        except self.table.refused:
            return self._outcome_refused(tenant_id, record_id, text, None, keep_training)
        except self.table.client.exceptions.ClientError as exc:
            if _item_too_large(exc):
                return self._outcome_refused(tenant_id, record_id, text, exc, keep_training)
            raise
        return True

    def _outcome_refused(self, tenant_id: str, record_id: str, outcome: str, error: Exception | None,
                         keep_training: bool = False) -> bool:
        """Why the outcome was not written: no such live record (False), an outcome that trains
        where it was to be kept (OutcomeTrains), or the record would pass the item limit with it
        (RecordTooLarge, with the figure)."""
        found = self._live_record(tenant_id, record_id)
        if found is None:
            return False
        if keep_training and found.get("outcome_trains"):
            raise OutcomeTrains(record_id)
        size = record_item_bytes(tenant_id, record_id, found.get("catalogs") or [], found["body"], outcome)
        raise RecordTooLarge(size if size > MAX_RECORD_ITEM_BYTES else None, outcome=True) from error

    def scan_records(self, tenant_id: str, *, catalog: str | None = None, since: float | None = None,
                     before: str | None = None) -> Iterator[ListedRecord]:
        condition, values = "tenant_id = :t", {":t": {"S": tenant_id}}
        if before is not None:
            condition += " AND record_id < :b"
            values[":b"] = {"S": before}
        start = None
        while True:
            now = time.time()
            extra = {"ExclusiveStartKey": start} if start else {}
            # Each reply is at most 1 MB of items: the caller stops asking where its page ends.
            reply = self.table.client.query(TableName=self.table.name, KeyConditionExpression=condition,
                                            ExpressionAttributeValues=values, ScanIndexForward=False, **extra)
            for raw in reply["Items"]:
                found = plain(raw)
                size = len(found["body"]) + len(found.get("outcome") or "")
                matches = (found["expires_at"] > now and (since is None or found["created_at"] >= since)
                           and (catalog is None or catalog in (found.get("catalogs") or [])))
                yield ListedRecord(found["record_id"], size, _record(found) if matches else None)
            start = reply.get("LastEvaluatedKey")
            if not start:
                return


def _item_too_large(exc: Exception) -> bool:
    """DynamoDB's refusal of an item over its size limit, as PutItem and UpdateItem word it."""
    error = getattr(exc, "response", {}).get("Error", {})
    return error.get("Code") == "ValidationException" and "Item size" in str(error.get("Message", ""))


def _record(found: dict[str, Any]) -> dict[str, Any]:
    return {**json.loads(found["body"]), "outcome": json.loads(found["outcome"]) if found.get("outcome") else None}
