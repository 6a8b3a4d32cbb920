"""The DynamoDB store (AWS; moto in tests). Same contract as the SQLite store.

Tenants and keys: two tables, each with a string partition key `pk` and sort key `sk`:
- tenants: tenants (`TENANT#<id>` / `TENANT`) and IAM principal rules
  (`PRINCIPAL#<normalised arn>` / `RULE`);
- keys: API key records (`KEY#<key id>` / `KEY`, found per tenant through the
  `by_tenant` index on `tenant_id` + `created_at`) and token revocations
  (`REVOKED` / `<tenant>#<token id>`, removed by DynamoDB's TTL on `ttl` once the token
  expired), "not before" times (`NOTBEFORE` / `<subject>`) and counters
  (`COUNTER` / `<name>`, expired by TTL), tallies of spend (`COUNTER` / `tally:<name>`)
  and each tenant's usage by day and entry (`USAGE#<tenant>` / `<day>#<entry>`, read by
  a Query on one tenant's partition). Every read of the hot path is a GetItem by key.
Catalogs: partition `pk` = `<tenant>#<name>`, numeric sort key `version`; the
`by_tenant` index (`tenant_id`, `name_version`) lists a tenant's entries.
Records: partition `tenant_id`, sort key `record_id` (time-ordered ids), expired by TTL;
`item_bytes` is what the record takes before its outcome (`record_item_bytes`), so that
attaching an outcome is held to the item limit by the write's own condition, with no read.
Writes that must not overwrite are conditional, so a race never loses a record.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from gateway.auth.store import ApiKeyRecord, PrincipalRule, Tenant, TenantLimits, UsageRow
from gateway.catalogs.model import CatalogVersion
from gateway.catalogs.store import VersionTaken
from gateway.decisions.idempotency import Entry
from gateway.decisions.records import (
    MAX_RECORD_ITEM_BYTES,
    ListedRecord,
    OutcomeTrains,
    RecordTooLarge,
    check_record_item,
    record_item_bytes,
)
from gateway.stores import Stores

_REVOKED = "REVOKED"


class DynamoDBStore:
    def __init__(self, tenants_table: str, keys_table: str, client: Any = None, *, catalogs_table: str | None = None,
                 records_table: str | None = None) -> None:
        self.tenants_table = tenants_table
        self.keys_table = keys_table
        self.catalogs_table = catalogs_table
        self.records_table = records_table
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:  # lazily: no I/O at import or construction
            from gateway import aws

            self._client = aws.client("dynamodb", hot_path=True)
        return self._client

    def stores(self) -> Stores:
        """Catalogs and records only where their table is configured."""
        return Stores(tenants=self, catalogs=self if self.catalogs_table else None,
                      records=self if self.records_table else None, idempotency=self)

    def create_tables(self) -> None:
        """For tests and local tools; in AWS the template creates the tables."""
        keys = [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}]
        attributes = [{"AttributeName": "pk", "AttributeType": "S"}, {"AttributeName": "sk", "AttributeType": "S"}]
        self.client.create_table(TableName=self.tenants_table, KeySchema=keys, AttributeDefinitions=attributes,
                                 BillingMode="PAY_PER_REQUEST")
        self.client.create_table(
            TableName=self.keys_table, KeySchema=keys, BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[*attributes, {"AttributeName": "tenant_id", "AttributeType": "S"},
                                  {"AttributeName": "created_at", "AttributeType": "N"}],
            GlobalSecondaryIndexes=[{
                "IndexName": "by_tenant",
                "KeySchema": [{"AttributeName": "tenant_id", "KeyType": "HASH"},
                              {"AttributeName": "created_at", "KeyType": "RANGE"}],
                "Projection": {"ProjectionType": "ALL"},
            }],
        )

        if self.catalogs_table:
            self.client.create_table(
                TableName=self.catalogs_table, BillingMode="PAY_PER_REQUEST",
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "version", "KeyType": "RANGE"}],
                AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"},
                                      {"AttributeName": "version", "AttributeType": "N"},
                                      {"AttributeName": "tenant_id", "AttributeType": "S"},
                                      {"AttributeName": "name_version", "AttributeType": "S"}],
                GlobalSecondaryIndexes=[{
                    "IndexName": "by_tenant",
                    "KeySchema": [{"AttributeName": "tenant_id", "KeyType": "HASH"},
                                  {"AttributeName": "name_version", "KeyType": "RANGE"}],
                    "Projection": {"ProjectionType": "ALL"},
                }],
            )
        if self.records_table:
            self.client.create_table(
                TableName=self.records_table, BillingMode="PAY_PER_REQUEST",
                KeySchema=[{"AttributeName": "tenant_id", "KeyType": "HASH"}, {"AttributeName": "record_id", "KeyType": "RANGE"}],
                AttributeDefinitions=[{"AttributeName": "tenant_id", "AttributeType": "S"},
                                      {"AttributeName": "record_id", "AttributeType": "S"}],
            )

    # -- tenants ----------------------------------------------------------------------

    def put_tenant(self, tenant: Tenant) -> None:
        self.client.put_item(TableName=self.tenants_table, Item=_item({
            "pk": f"TENANT#{tenant.tenant_id}", "sk": "TENANT", "tenant_id": tenant.tenant_id, "name": tenant.name,
            "created_at": tenant.created_at, "catalog_only": tenant.catalog_only, "limits": json.dumps(tenant.limits.as_json()),
        }))

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        item = self._get(self.tenants_table, f"TENANT#{tenant_id}", "TENANT")
        if item is None:
            return None
        limits = TenantLimits.from_json(json.loads(item["limits"]) if item.get("limits") else None)
        return Tenant(item["tenant_id"], item["name"], item["created_at"], bool(item.get("catalog_only", False)), limits)

    # -- principal rules --------------------------------------------------------------

    def put_principal_rule(self, rule: PrincipalRule) -> None:
        self.client.put_item(TableName=self.tenants_table, Item=_item({
            "pk": f"PRINCIPAL#{rule.principal_arn}", "sk": "RULE", "principal_arn": rule.principal_arn,
            "tenant_id": rule.tenant_id, "scopes": list(rule.scopes), "models": _list_or_none(rule.models),
            "created_at": rule.created_at,
        }))

    def get_principal_rule(self, principal_arn: str) -> PrincipalRule | None:
        item = self._get(self.tenants_table, f"PRINCIPAL#{principal_arn}", "RULE")
        if item is None:
            return None
        return PrincipalRule(item["principal_arn"], item["tenant_id"], tuple(item["scopes"]), _tuple_or_none(item.get("models")),
                             item["created_at"])

    def delete_principal_rule(self, principal_arn: str) -> bool:
        key = _item({"pk": f"PRINCIPAL#{principal_arn}", "sk": "RULE"})
        reply = self.client.delete_item(TableName=self.tenants_table, Key=key, ReturnValues="ALL_OLD")
        return "Attributes" in reply

    # -- API keys ---------------------------------------------------------------------

    def put_api_key(self, record: ApiKeyRecord) -> None:
        item = {
            "pk": f"KEY#{record.key_id}", "sk": "KEY", "key_id": record.key_id, "tenant_id": record.tenant_id,
            "key_hash": record.key_hash, "scopes": list(record.scopes), "models": _list_or_none(record.models),
            "created_at": record.created_at, "expires_at": record.expires_at, "revoked_at": record.revoked_at,
            "last_used_at": record.last_used_at, "name": record.name,
        }
        try:
            self.client.put_item(TableName=self.keys_table, Item=_item(item), ConditionExpression="attribute_not_exists(pk)")
        except self.client.exceptions.ConditionalCheckFailedException:
            raise ValueError(f"key id {record.key_id!r} exists") from None

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        item = self._get(self.keys_table, f"KEY#{key_id}", "KEY")
        # An item without a hash, tenant or scopes is no key: the functions' only write to a key
        # item (its last use) creates one where no key exists, and it must read as none (401).
        if item is None or not all(name in item for name in _KEY_ATTRIBUTES):
            return None
        return _api_key(item)

    def list_api_keys(self, tenant_id: str) -> list[ApiKeyRecord]:
        records, start = [], None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            reply = self.client.query(TableName=self.keys_table, IndexName="by_tenant", KeyConditionExpression="tenant_id = :t",
                                      ExpressionAttributeValues={":t": {"S": tenant_id}}, **extra)
            records.extend(_api_key(_plain(item)) for item in reply["Items"] if _plain(item).get("sk") == "KEY")
            start = reply.get("LastEvaluatedKey")
            if not start:
                return records

    def revoke_api_key(self, key_id: str, when: float) -> bool:
        try:
            self.client.update_item(
                TableName=self.keys_table, Key=_item({"pk": f"KEY#{key_id}", "sk": "KEY"}),
                UpdateExpression="SET revoked_at = :w",
                ConditionExpression="attribute_exists(pk) AND (attribute_not_exists(revoked_at) OR revoked_at = :null)",
                ExpressionAttributeValues={":w": _value(when), ":null": {"NULL": True}},
            )
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def touch_api_key(self, key_id: str, when: float) -> None:
        try:
            self.client.update_item(TableName=self.keys_table, Key=_item({"pk": f"KEY#{key_id}", "sk": "KEY"}),
                                    UpdateExpression="SET last_used_at = :w", ConditionExpression="attribute_exists(pk)",
                                    ExpressionAttributeValues={":w": _value(when)})
        except self.client.exceptions.ConditionalCheckFailedException:
            pass

    # -- token revocations --------------------------------------------------------------

    def revoke_token(self, token_id: str, tenant_id: str, expires_at: float) -> None:
        self.client.put_item(TableName=self.keys_table, Item=_item({
            "pk": _REVOKED, "sk": f"{tenant_id}#{token_id}", "tenant_id": tenant_id, "expires_at": expires_at,
            "ttl": int(expires_at) + 3600, "created_at": time.time(),
        }))

    def token_revoked(self, tenant_id: str, token_id: str, now: float) -> bool:
        item = self._get(self.keys_table, _REVOKED, f"{tenant_id}#{token_id}")
        return item is not None and item["expires_at"] > now

    def set_not_before(self, subject: str, when: float) -> None:
        try:
            self.client.put_item(TableName=self.keys_table, Item=_item({"pk": "NOTBEFORE", "sk": subject, "at": when}),
                                 ConditionExpression="attribute_not_exists(pk) OR #at < :at",
                                 ExpressionAttributeNames={"#at": "at"}, ExpressionAttributeValues={":at": _value(when)})
        except self.client.exceptions.ConditionalCheckFailedException:
            pass  # a later time is set already: keep it

    def not_before(self, subject: str) -> float | None:
        item = self._get(self.keys_table, "NOTBEFORE", subject)
        return None if item is None else item["at"]

    def count_within(self, name: str, limit: int, expires_at: float) -> bool:
        try:
            self.client.update_item(
                TableName=self.keys_table, Key=_item({"pk": "COUNTER", "sk": name}),
                UpdateExpression="ADD #count :one SET #ttl = if_not_exists(#ttl, :ttl)",
                ConditionExpression="attribute_not_exists(#count) OR #count < :limit",
                ExpressionAttributeNames={"#count": "count", "#ttl": "ttl"},
                ExpressionAttributeValues={":one": _value(1), ":limit": _value(limit), ":ttl": _value(int(expires_at))})
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def add_within(self, name: str, amount: int, limit: int | None, expires_at: float) -> bool:
        condition = {} if limit is None else {"ConditionExpression": "attribute_not_exists(#amount) OR #amount < :limit"}
        try:
            self.client.update_item(
                TableName=self.keys_table, Key=_item({"pk": "COUNTER", "sk": f"tally:{name}"}),
                UpdateExpression="ADD #amount :amount SET #ttl = if_not_exists(#ttl, :ttl)", **condition,
                ExpressionAttributeNames={"#amount": "amount", "#ttl": "ttl"},
                ExpressionAttributeValues={":amount": _value(amount), ":ttl": _value(int(expires_at)),
                                           **({} if limit is None else {":limit": _value(limit)})})
        except self.client.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def tally(self, name: str) -> int:
        item = self._get(self.keys_table, "COUNTER", f"tally:{name}")
        return 0 if item is None or item["ttl"] < time.time() else int(item["amount"])

    def add_usage(self, tenant_id: str, row: UsageRow, expires_at: float) -> None:
        self.client.update_item(
            TableName=self.keys_table, Key=_item({"pk": f"USAGE#{tenant_id}", "sk": f"{row.day}#{row.entry}"}),
            UpdateExpression="ADD requests :requests, cost_nano_usd :cost, endpoint_ms :ms SET #ttl = :ttl",
            ExpressionAttributeNames={"#ttl": "ttl"},
            ExpressionAttributeValues={":requests": _value(row.requests), ":cost": _value(row.cost_nano_usd),
                                       ":ms": _value(row.endpoint_ms), ":ttl": _value(int(expires_at))})

    def usage(self, tenant_id: str, first_day: str, last_day: str) -> list[UsageRow]:
        rows: list[UsageRow] = []
        start: dict[str, Any] = {}
        while True:  # "<day>#<entry>": from the first day's first entry to past the last day's last ("$" > "#")
            reply = self.client.query(
                TableName=self.keys_table, KeyConditionExpression="pk = :pk AND sk BETWEEN :first AND :last",
                ExpressionAttributeValues=_item({":pk": f"USAGE#{tenant_id}", ":first": f"{first_day}#",
                                                 ":last": f"{last_day}$"}), ConsistentRead=True,
                Select="SPECIFIC_ATTRIBUTES", ProjectionExpression="pk, sk, requests, cost_nano_usd, endpoint_ms", **start)
            for item in map(_plain, reply.get("Items", [])):
                day, _, entry = item["sk"].partition("#")
                rows.append(UsageRow(day, entry, int(item["requests"]), int(item["cost_nano_usd"]), int(item["endpoint_ms"])))
            if "LastEvaluatedKey" not in reply:
                return rows
            start = {"ExclusiveStartKey": reply["LastEvaluatedKey"]}

    def hold(self, name: str, holder: str, limit: int, expires_at: float, now: float) -> bool:
        """One conditional write: the place joins the string set `held` ("<expiry>|<holder>")
        while it has fewer than `limit` members. When it is full, its expired members (a
        function that died holding one) are removed and the write is tried once more."""
        member = f"{math.ceil(expires_at)}|{holder}"
        for attempt in range(2):
            try:
                self.client.update_item(
                    TableName=self.keys_table, Key=_item({"pk": "COUNTER", "sk": f"places:{name}"}),
                    UpdateExpression="ADD #held :member SET #ttl = :ttl",
                    ConditionExpression="attribute_not_exists(#held) OR size(#held) < :limit",
                    ExpressionAttributeNames={"#held": "held", "#ttl": "ttl"},
                    ExpressionAttributeValues={":member": {"SS": [member]}, ":limit": _value(limit),
                                               ":ttl": _value(int(expires_at) + 3600)})
                return True
            except self.client.exceptions.ConditionalCheckFailedException:
                if attempt or not self._drop_expired(name, now):
                    return False
        return False

    def _drop_expired(self, name: str, now: float) -> bool:
        item = self._get(self.keys_table, "COUNTER", f"places:{name}") or {}
        expired = [m for m in item.get("held", ()) if float(m.partition("|")[0]) <= now]
        if not expired:
            return False
        self.client.update_item(TableName=self.keys_table, Key=_item({"pk": "COUNTER", "sk": f"places:{name}"}),
                                UpdateExpression="DELETE #held :expired", ExpressionAttributeNames={"#held": "held"},
                                ExpressionAttributeValues={":expired": {"SS": expired}})
        return True

    def release(self, name: str, holder: str) -> None:
        item = self._get(self.keys_table, "COUNTER", f"places:{name}") or {}
        mine = [m for m in item.get("held", ()) if m.partition("|")[2] == holder]
        if mine:
            self.client.update_item(TableName=self.keys_table, Key=_item({"pk": "COUNTER", "sk": f"places:{name}"}),
                                    UpdateExpression="DELETE #held :mine", ExpressionAttributeNames={"#held": "held"},
                                    ExpressionAttributeValues={":mine": {"SS": mine}})

    # -- idempotent requests: `IDEMPOTENCY#<tenant>` / <key hash>, in the keys table -------

    def claim_request(self, tenant_id: str, key: str, fingerprint: str, until: float, now: float) -> Entry | None:
        pk = f"IDEMPOTENCY#{tenant_id}"
        for _ in range(2):  # an entry that expires between the write and the read: claim again
            try:
                self.client.put_item(TableName=self.keys_table, Item=_item({
                    "pk": pk, "sk": key, "fingerprint": fingerprint, "expires_at": until, "ttl": int(until) + 1}),
                    ConditionExpression="attribute_not_exists(pk) OR expires_at <= :now",
                    ExpressionAttributeValues={":now": _value(now)})
                return None
            except self.client.exceptions.ConditionalCheckFailedException:
                item = self._get(self.keys_table, pk, key)
                if item is not None and item["expires_at"] > now:
                    reply = item.get("reply")
                    return Entry(item["fingerprint"], bytes(reply) if reply is not None else None)
        raise RuntimeError("an idempotency entry kept changing under its claim")  # a 503 for the caller

    def finish_request(self, tenant_id: str, key: str, fingerprint: str, reply: bytes, until: float) -> None:
        try:
            self.client.update_item(
                TableName=self.keys_table, Key=_item({"pk": f"IDEMPOTENCY#{tenant_id}", "sk": key}),
                UpdateExpression="SET reply = :reply, expires_at = :until, #ttl = :ttl",
                ConditionExpression="fingerprint = :fingerprint AND attribute_not_exists(reply)",
                ExpressionAttributeNames={"#ttl": "ttl"},
                ExpressionAttributeValues={":reply": {"B": reply}, ":until": _value(until), ":ttl": _value(int(until) + 1),
                                           ":fingerprint": _value(fingerprint)})
        except self.client.exceptions.ConditionalCheckFailedException:
            pass  # the claim expired and another took it: never an item without its request

    def drop_request(self, tenant_id: str, key: str, fingerprint: str) -> None:
        # Expired rather than deleted: this function deletes nothing in the keys table.
        try:
            self.client.update_item(TableName=self.keys_table, Key=_item({"pk": f"IDEMPOTENCY#{tenant_id}", "sk": key}),
                                    UpdateExpression="SET expires_at = :gone",
                                    ConditionExpression="fingerprint = :fingerprint AND attribute_not_exists(reply)",
                                    ExpressionAttributeValues={":gone": _value(0), ":fingerprint": _value(fingerprint)})
        except self.client.exceptions.ConditionalCheckFailedException:
            pass  # finished meanwhile: the reply is kept

    # -- catalogs -----------------------------------------------------------------------

    def insert_catalog_version(self, version: CatalogVersion) -> None:
        item = {"pk": f"{version.tenant_id}#{version.name}", "version": version.version, "tenant_id": version.tenant_id,
                "name": version.name, "name_version": f"{version.name}#{version.version:09d}",
                "content_hash": version.content_hash, "content": version.content, "created_at": version.created_at}
        try:
            self.client.put_item(TableName=self.catalogs_table, Item=_item(item), ConditionExpression="attribute_not_exists(pk)")
        except self.client.exceptions.ConditionalCheckFailedException:
            raise VersionTaken(version.ref) from None

    def get_catalog_version(self, tenant_id: str, name: str, version: int) -> CatalogVersion | None:
        reply = self.client.get_item(TableName=self.catalogs_table, Key=_item({"pk": f"{tenant_id}#{name}", "version": version}),
                                     ConsistentRead=True)
        return _catalog_version(_plain(reply["Item"])) if "Item" in reply else None

    def latest_catalog_version(self, tenant_id: str, name: str) -> CatalogVersion | None:
        reply = self.client.query(TableName=self.catalogs_table, KeyConditionExpression="pk = :p", ScanIndexForward=False,
                                  Limit=1, ConsistentRead=True, ExpressionAttributeValues={":p": {"S": f"{tenant_id}#{name}"}})
        return _catalog_version(_plain(reply["Items"][0])) if reply["Items"] else None

    def list_catalog_versions(self, tenant_id: str, name: str, after: int = 0, limit: int | None = None
                              ) -> list[CatalogVersion]:
        found: list[CatalogVersion] = []
        start = None
        while limit is None or len(found) < limit:
            extra = {"ExclusiveStartKey": start} if start else {}
            if limit is not None:
                extra["Limit"] = limit - len(found)
            reply = self.client.query(TableName=self.catalogs_table, KeyConditionExpression="pk = :p AND #v > :a",
                                      ConsistentRead=True, ExpressionAttributeNames={"#v": "version"},
                                      ExpressionAttributeValues={
                                          ":p": {"S": f"{tenant_id}#{name}"}, ":a": _value(after)}, **extra)
            found.extend(_catalog_version(_plain(item)) for item in reply["Items"])
            start = reply.get("LastEvaluatedKey")
            if not start:
                break
        return found

    def list_catalog_tenants(self) -> list[str]:
        """A Scan of the catalogs table for its items' tenant ids alone (IAM grants the scheduled
        refit exactly that: dynamodb:Select SPECIFIC_ATTRIBUTES, that attribute)."""
        found, start = set(), None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            reply = self.client.scan(TableName=self.catalogs_table, Select="SPECIFIC_ATTRIBUTES",
                                     ProjectionExpression="tenant_id", **extra)
            found.update(_plain(item)["tenant_id"] for item in reply["Items"])
            start = reply.get("LastEvaluatedKey")
            if not start:
                return sorted(found)

    def list_catalogs(self, tenant_id: str) -> list[CatalogVersion]:
        """Each entry's latest version. The tenant's versions are listed by name and number
        alone, then each latest is read: an entry refitted daily gains a version of up to
        ~48 KB a day, and reading every version's content made this list (and the 256 MB
        function that serves it) grow without bound."""
        items = self._query_all(TableName=self.catalogs_table, IndexName="by_tenant", KeyConditionExpression="tenant_id = :t",
                                ProjectionExpression="#n, #v", ExpressionAttributeNames={"#n": "name", "#v": "version"},
                                ExpressionAttributeValues={":t": {"S": tenant_id}})
        newest: dict[str, int] = {}
        for item in items:
            newest[item["name"]] = max(int(item["version"]), newest.get(item["name"], 0))
        found = (self.get_catalog_version(tenant_id, name, version) for name, version in sorted(newest.items()))
        return [version for version in found if version is not None]

    # -- decision records ---------------------------------------------------------------

    def put_record(self, tenant_id: str, record_id: str, created_at: float, catalogs: list[str], body: dict[str, Any],
                   expires_at: float) -> None:
        text = json.dumps(body)
        size = record_item_bytes(tenant_id, record_id, catalogs, text)
        check_record_item(size, outcome=False)
        item = {"tenant_id": tenant_id, "record_id": record_id, "created_at": created_at, "catalogs": catalogs or None,
                "body": text, "ttl": int(expires_at), "expires_at": expires_at, "item_bytes": size}
        try:
            self.client.put_item(TableName=self.records_table, Item=_item(item),
                                 ConditionExpression="attribute_not_exists(record_id)")
        except self.client.exceptions.ClientError as exc:
            if _item_too_large(exc):  # DynamoDB counted more than record_item_bytes: still the caller's 413
                raise RecordTooLarge(None, outcome=False) from exc
            raise

    def get_record(self, tenant_id: str, record_id: str) -> dict[str, Any] | None:
        item = self._live_record(tenant_id, record_id)
        return None if item is None else _record(item)

    def _live_record(self, tenant_id: str, record_id: str) -> dict[str, Any] | None:
        reply = self.client.get_item(TableName=self.records_table, Key=_item({"tenant_id": tenant_id, "record_id": record_id}),
                                     ConsistentRead=True)
        if "Item" not in reply:
            return None
        item = _plain(reply["Item"])
        return item if item["expires_at"] > time.time() else None  # TTL deletion lags; expiry does not

    def set_outcome(self, tenant_id: str, record_id: str, outcome: dict[str, Any], *, keep_training: bool = False) -> bool:
        text = json.dumps(outcome)
        room = MAX_RECORD_ITEM_BYTES - len(text.encode("utf-8", "surrogatepass"))
        # Records written before item_bytes are held to the limit by DynamoDB itself (below).
        condition = ("attribute_exists(record_id) AND expires_at > :now"
                     " AND (attribute_not_exists(item_bytes) OR item_bytes <= :room)")
        values = {":o": {"S": text}, ":now": _value(time.time()), ":room": _value(room),
                  ":trains": _value(bool(outcome.get("trains")))}
        if keep_training:
            condition += " AND (attribute_not_exists(outcome_trains) OR outcome_trains = :no)"
            values[":no"] = _value(False)
        try:
            self.client.update_item(
                TableName=self.records_table, Key=_item({"tenant_id": tenant_id, "record_id": record_id}),
                UpdateExpression="SET outcome = :o, outcome_trains = :trains", ConditionExpression=condition,
                ExpressionAttributeValues=values,
            )
        except self.client.exceptions.ConditionalCheckFailedException:
            return self._outcome_refused(tenant_id, record_id, text, None, keep_training)
        except self.client.exceptions.ClientError as exc:
            if _item_too_large(exc):
                return self._outcome_refused(tenant_id, record_id, text, exc, keep_training)
            raise
        return True

    def _outcome_refused(self, tenant_id: str, record_id: str, outcome: str, error: Exception | None,
                         keep_training: bool = False) -> bool:
        """Why the outcome was not written: no such live record (False), an outcome that trains
        where it was to be kept (OutcomeTrains), or the record would pass the item limit with it
        (RecordTooLarge, with the figure)."""
        item = self._live_record(tenant_id, record_id)
        if item is None:
            return False
        if keep_training and item.get("outcome_trains"):
            raise OutcomeTrains(record_id)
        size = record_item_bytes(tenant_id, record_id, item.get("catalogs") or [], item["body"], outcome)
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
            reply = self.client.query(TableName=self.records_table, KeyConditionExpression=condition,
                                      ExpressionAttributeValues=values, ScanIndexForward=False, **extra)
            for raw in reply["Items"]:
                item = _plain(raw)
                size = len(item["body"]) + len(item.get("outcome") or "")
                matches = (item["expires_at"] > now and (since is None or item["created_at"] >= since)
                           and (catalog is None or catalog in (item.get("catalogs") or [])))
                yield ListedRecord(item["record_id"], size, _record(item) if matches else None)
            start = reply.get("LastEvaluatedKey")
            if not start:
                return

    def _query_all(self, **request: Any) -> list[dict[str, Any]]:
        items, start = [], None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            reply = self.client.query(**request, **extra)
            items.extend(_plain(item) for item in reply["Items"])
            start = reply.get("LastEvaluatedKey")
            if not start:
                return items

    def _get(self, table: str, pk: str, sk: str) -> dict[str, Any] | None:
        reply = self.client.get_item(TableName=table, Key=_item({"pk": pk, "sk": sk}), ConsistentRead=True)
        return _plain(reply["Item"]) if "Item" in reply else None


def _value(value: Any) -> dict[str, Any]:
    """One value in DynamoDB's typed JSON, as boto3's TypeSerializer writes it (floats through
    their shortest repr, so 0.1 is stored as 0.1); its import is most of boto3's cold start."""
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
        members = [_value(v) for v in value]
        kinds = {next(iter(m)) for m in members}
        if not members or len(kinds) != 1 or not kinds <= {"S", "N", "B"}:
            raise TypeError("a DynamoDB set holds strings, numbers or bytes, of one kind, at least one")
        (kind,) = kinds
        return {kind + "S": [m[kind] for m in members]}
    if isinstance(value, list | tuple):
        return {"L": [_value(v) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("a DynamoDB map's keys are strings")
        return {"M": {k: _value(v) for k, v in value.items()}}
    raise TypeError(f"no DynamoDB type for {type(value).__name__}")


def _python(typed: dict[str, Any]) -> Any:
    """One typed value back as Python (numbers as Decimal, as boto3's TypeDeserializer reads them)."""
    [(kind, value)] = typed.items()
    readers = {"NULL": lambda v: None, "BOOL": bool, "N": Decimal, "S": str, "B": bytes,
               "SS": set, "NS": lambda v: {Decimal(n) for n in v}, "BS": lambda v: {bytes(b) for b in v},
               "L": lambda v: [_python(x) for x in v], "M": lambda v: {k: _python(x) for k, x in v.items()}}
    return readers[kind](value)


def _item(values: dict[str, Any]) -> dict[str, Any]:
    return {key: _value(value) for key, value in values.items()}


def _plain(item: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in item.items():
        plain = _python(value)
        out[key] = float(plain) if isinstance(plain, Decimal) else plain
    return out


def _list_or_none(values: tuple[str, ...] | None) -> list[str] | None:
    return None if values is None else list(values)


def _tuple_or_none(values: list[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


def _catalog_version(item: dict[str, Any]) -> CatalogVersion:
    return CatalogVersion(item["tenant_id"], item["name"], int(item["version"]), item["content_hash"], item["content"],
                          item["created_at"])


def _item_too_large(exc: Exception) -> bool:
    """DynamoDB's refusal of an item over its size limit, as PutItem and UpdateItem word it."""
    error = getattr(exc, "response", {}).get("Error", {})
    return error.get("Code") == "ValidationException" and "Item size" in str(error.get("Message", ""))


def _record(item: dict[str, Any]) -> dict[str, Any]:
    return {**json.loads(item["body"]), "outcome": json.loads(item["outcome"]) if item.get("outcome") else None}


_KEY_ATTRIBUTES = ("key_id", "tenant_id", "key_hash", "scopes", "created_at")


def _api_key(item: dict[str, Any]) -> ApiKeyRecord:
    return ApiKeyRecord(
        key_id=item["key_id"], tenant_id=item["tenant_id"], key_hash=item["key_hash"], scopes=tuple(item["scopes"]),
        models=_tuple_or_none(item.get("models")), created_at=item["created_at"], expires_at=item.get("expires_at"),
        revoked_at=item.get("revoked_at"), last_used_at=item.get("last_used_at"), name=item.get("name", ""),
    )
