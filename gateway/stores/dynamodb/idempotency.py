"""Idempotent requests' claims and replies in the keys table (`IDEMPOTENCY#<tenant>` /
<key hash>), expired by TTL: the gateway function deletes nothing in that table (IAM grants it no DeleteItem there)."""

from __future__ import annotations

from typing import Any

from gateway.decisions.idempotency import Entry
from gateway.stores.dynamodb.items import Table, ttl_of, typed


class DynamoDBIdempotency:
    def __init__(self, client: Any, keys_table: str) -> None:
        self.keys = Table(client, keys_table)

    def claim_request(self, tenant_id: str, key: str, fingerprint: str, until: float, now: float) -> Entry | None:
        pk = f"IDEMPOTENCY#{tenant_id}"
        for _ in range(2):  # an entry that expires between the write and the read: claim again
            try:
                self.keys.put({"pk": pk, "sk": key, "fingerprint": fingerprint, "expires_at": until, "ttl": ttl_of(until)},
                              ConditionExpression="attribute_not_exists(pk) OR expires_at <= :now",
                              ExpressionAttributeValues={":now": typed(now)})
                return None
            except self.keys.refused:
                found = self.keys.get({"pk": pk, "sk": key})
                if found is not None and found["expires_at"] > now:
                    reply = found.get("reply")
                    return Entry(found["fingerprint"], bytes(reply) if reply is not None else None)
        raise RuntimeError("an idempotency entry kept changing under its claim")  # a 503 for the caller

    def finish_request(self, tenant_id: str, key: str, fingerprint: str, reply: bytes, until: float) -> None:
        try:
            self.keys.update(
                {"pk": f"IDEMPOTENCY#{tenant_id}", "sk": key},
                UpdateExpression="SET reply = :reply, expires_at = :until, #ttl = :ttl",
                ConditionExpression="fingerprint = :fingerprint AND attribute_not_exists(reply)",
                ExpressionAttributeNames={"#ttl": "ttl"},
                ExpressionAttributeValues={":reply": {"B": reply}, ":until": typed(until), ":ttl": typed(ttl_of(until)),
                                           ":fingerprint": typed(fingerprint)})
        except self.keys.refused:
            pass  # the claim expired and another took it: never an item without its request

    def drop_request(self, tenant_id: str, key: str, fingerprint: str) -> None:
        try:  # expired rather than deleted
            self.keys.update({"pk": f"IDEMPOTENCY#{tenant_id}", "sk": key}, UpdateExpression="SET expires_at = :gone",
                             ConditionExpression="fingerprint = :fingerprint AND attribute_not_exists(reply)",
                             ExpressionAttributeValues={":gone": typed(0), ":fingerprint": typed(fingerprint)})
        except self.keys.refused:
            pass  # finished meanwhile: the reply is kept
