"""DynamoDB's typed JSON, and the reads every table of the stores makes.

The values are written as boto3's TypeSerializer writes them (floats through their
shortest repr, so 0.1 is stored as 0.1), without boto3: its import is most of a cold start.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any


def typed(value: Any) -> dict[str, Any]:
    """One value in DynamoDB's typed JSON."""
    if value is None:
        return {"NULL": True}
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | float | Decimal):
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        if not number.is_finite():
            raise TypeError("DynamoDB stores no NaN or infinity")
        return {"N": str(number)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, bytes | bytearray):
        return {"B": bytes(value)}
    if isinstance(value, set | frozenset):
        members = [typed(v) for v in value]
        kinds = {next(iter(m)) for m in members}
        if not members or len(kinds) != 1 or not kinds <= {"S", "N", "B"}:
            raise TypeError("a DynamoDB set holds strings, numbers or bytes, of one kind, at least one")
        (kind,) = kinds
        return {kind + "S": [m[kind] for m in members]}
    if isinstance(value, list | tuple):
        return {"L": [typed(v) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("a DynamoDB map's keys are strings")
        return {"M": {k: typed(v) for k, v in value.items()}}
    raise TypeError(f"no DynamoDB type for {type(value).__name__}")


def _python(value: dict[str, Any]) -> Any:
    """One typed value back as Python (numbers as Decimal, as boto3's TypeDeserializer reads them)."""
    [(kind, raw)] = value.items()
    readers = {"NULL": lambda v: None, "BOOL": bool, "N": Decimal, "S": str, "B": bytes,
               "SS": set, "NS": lambda v: {Decimal(n) for n in v}, "BS": lambda v: {bytes(b) for b in v},
               "L": lambda v: [_python(x) for x in v], "M": lambda v: {k: _python(x) for k, x in v.items()}}
    return readers[kind](raw)


def item(values: dict[str, Any]) -> dict[str, Any]:
    return {key: typed(value) for key, value in values.items()}


def plain(typed_item: dict[str, Any]) -> dict[str, Any]:
    """An item as Python, its numbers as floats."""
    out = {}
    for key, value in typed_item.items():
        python = _python(value)
        out[key] = float(python) if isinstance(python, Decimal) else python
    return out


def ttl_of(until: float) -> int:
    """The TTL attribute for an item that expires at `until`: whole seconds past it, so that
    DynamoDB's TTL never removes an item its reader still takes as live."""
    return int(until) + 1


def tuple_or_none(values: list[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


class Table:
    """One table through the client the composition root built: the reads each store repeats."""

    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.name = name

    @property
    def refused(self) -> type[Exception]:
        """What a write whose condition failed raises."""
        return self.client.exceptions.ConditionalCheckFailedException

    def get(self, key: dict[str, Any]) -> dict[str, Any] | None:
        reply = self.client.get_item(TableName=self.name, Key=item(key), ConsistentRead=True)
        return plain(reply["Item"]) if "Item" in reply else None

    def query_pages(self, **request: Any) -> Any:
        """Every item a Query finds, page after page, as the caller consumes them."""
        return self._pages(self.client.query, request)

    def scan_pages(self, **request: Any) -> Any:
        """Every item a Scan finds, page after page, as the caller consumes them."""
        return self._pages(self.client.scan, request)

    def _pages(self, read: Any, request: dict[str, Any]) -> Any:
        start = None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            reply = read(TableName=self.name, **request, **extra)
            yield from map(plain, reply.get("Items", []))
            start = reply.get("LastEvaluatedKey")
            if not start:
                return

    def put(self, values: dict[str, Any], **conditions: Any) -> None:
        self.client.put_item(TableName=self.name, Item=item(values), **conditions)

    def update(self, key: dict[str, Any], **request: Any) -> dict[str, Any]:
        return self.client.update_item(TableName=self.name, Key=item(key), **request)

    def delete(self, key: dict[str, Any], **request: Any) -> dict[str, Any]:
        return self.client.delete_item(TableName=self.name, Key=item(key), **request)

    def transact(self, writes: list[dict[str, Any]]) -> bool:
        """TransactWriteItems: all of `writes` or none. False when a condition failed; any other
        cancellation (a conflicting write at the same moment, throttling) raises."""
        try:
            self.client.transact_write_items(TransactItems=writes)
        except self.client.exceptions.TransactionCanceledException as exc:
            codes = {reason.get("Code") for reason in exc.response.get("CancellationReasons", [])} - {None, "None"}
            if codes == {"ConditionalCheckFailed"}:
                return False
            raise
        return True

    def batch_write(self, requests: list[dict[str, Any]]) -> None:
        """BatchWriteItem's puts and deletes, 25 at a time, what DynamoDB left unprocessed sent again."""
        for start in range(0, len(requests), 25):
            pending = requests[start:start + 25]
            for attempt in range(8):
                reply = self.client.batch_write_item(RequestItems={self.name: pending})
                pending = reply.get("UnprocessedItems", {}).get(self.name, [])
                if not pending:
                    break
                time.sleep(min(2.0, 0.05 * 2 ** attempt))
            else:
                raise RuntimeError("DynamoDB left writes unprocessed after 8 attempts")


def index(name: str, partition: str, sort: str, projection: dict[str, Any] | None = None) -> dict[str, Any]:
    """A global secondary index's definition, for tables the tests and tools create."""
    return {"IndexName": name, "Projection": projection or {"ProjectionType": "ALL"},
            "KeySchema": [{"AttributeName": partition, "KeyType": "HASH"}, {"AttributeName": sort, "KeyType": "RANGE"}]}
