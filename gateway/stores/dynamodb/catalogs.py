"""Catalog versions in DynamoDB: partition `pk` = `<tenant>#<name>`, numeric sort key
`version`, one item per version, written only where none is (a race never loses one).

Each entry also has a head, the item of version 0: its latest version's number, whether
it refits daily, the version that made it enforcing. Only heads carry the `by_tenant`
index's keys (`tenant_id`, `name_version`), so the index holds one small item per entry
and never a version's content: listing a tenant's entries, counting them, finding the
tenants and the entries due for a refit read heads alone. A version and its head are
written in one transaction, with the expiry (`ttl`, DynamoDB's TTL) of the version it
replaces. Entries written before heads existed have their versions in the index: they
are still listed, and get a head at their next write, or from `adopt_entries_without_heads`
(`python -m devkit.admin adopt-catalog-heads`, once after the upgrade)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from gateway.catalogs.model import CatalogVersion
from gateway.catalogs.store import TooManyEntries, VersionTaken
from gateway.stores.dynamodb.items import Table, item, plain, ttl_of, typed

HEAD = 0
_LIVE = "(attribute_not_exists(expires_at) OR expires_at > :now)"


class DynamoDBCatalogs:
    def __init__(self, client: Any, catalogs_table: str) -> None:
        self.table = Table(client, catalogs_table)

    def insert_catalog_version(self, version: CatalogVersion, *, replaces: int, expire: dict[int, float],
                               max_entries: int) -> None:
        tenant_id, name, key = version.tenant_id, version.name, _key(version.tenant_id, version.name)
        values = {"pk": key, "version": version.version, "tenant": tenant_id, "name": name,
                  "content_hash": version.content_hash, "content": version.content, "created_at": version.created_at}
        if version.enforcing_since is not None:
            values["enforcing_since"] = version.enforcing_since
        head = {"pk": key, "version": HEAD, "tenant_id": tenant_id, "name_version": name, "name": name,
                "latest": version.version, "refit": version.refit, "enforcing_since": version.enforcing_since}
        writes = [{"Put": {"TableName": self.table.name, "Item": item(values),
                           "ConditionExpression": "attribute_not_exists(pk)"}},
                  # The version's own condition makes writers take turns; a head behind its versions
                  # (an entry written before heads existed, or by an earlier release) is moved on.
                  {"Put": {"TableName": self.table.name, "Item": item({k: v for k, v in head.items() if v is not None}),
                           "ConditionExpression": "attribute_not_exists(latest) OR latest <= :r",
                           "ExpressionAttributeValues": {":r": typed(replaces)}}}]
        if replaces == 0:  # a new entry: the tenant's count, in the same write, never past the cap
            writes.append({"Update": {"TableName": self.table.name, "Key": item(_count_key(tenant_id)),
                                      "UpdateExpression": "ADD entries :one",
                                      "ConditionExpression": "attribute_not_exists(entries) OR entries < :max",
                                      "ExpressionAttributeValues": {":one": typed(1), ":max": typed(max_entries)}}})
        counted = len(writes)
        writes += [{"Update": {"TableName": self.table.name, "Key": item({"pk": key, "version": old}),
                               "UpdateExpression": "SET expires_at = :e, #ttl = :t",
                               "ConditionExpression": "attribute_exists(pk)",
                               "ExpressionAttributeNames": {"#ttl": "ttl"},
                               "ExpressionAttributeValues": {":e": typed(until), ":t": typed(ttl_of(until))}}}
                   for old, until in sorted(expire.items())]
        while True:
            try:
                self.table.client.transact_write_items(TransactItems=writes)
                return
            except self.table.client.exceptions.TransactionCanceledException as exc:
                reasons = [reason.get("Code") for reason in exc.response.get("CancellationReasons", [])]
                failed = {i: code for i, code in enumerate(reasons) if code not in (None, "None")}
                if "TransactionConflict" in failed.values():
                    raise VersionTaken(version.ref) from None  # another write at once: read again and retry
                if not failed or any(code != "ConditionalCheckFailed" for code in failed.values()):
                    raise  # throttled, or the table unreachable: not the caller's to retry as a race
                if 0 in failed or 1 in failed:
                    raise VersionTaken(version.ref) from None
                if counted - 1 in failed and replaces == 0:
                    raise TooManyEntries(self.count_catalogs(tenant_id)) from None
                # A version to expire is gone already (deleted past the count): nothing to expire.
                writes = [write for i, write in enumerate(writes) if i not in failed]

    def delete_catalog_versions(self, tenant_id: str, name: str, below: int, keep: Iterable[int]) -> int:
        """Past the count only: DynamoDB's TTL deletes the expired ones."""
        if below <= 1:
            return 0
        kept, deleted = set(keep), 0
        old = self.table.query_pages(KeyConditionExpression="pk = :p AND #v BETWEEN :one AND :below",
                                     ProjectionExpression="#v", ExpressionAttributeNames={"#v": "version"},
                                     ExpressionAttributeValues={":p": {"S": _key(tenant_id, name)}, ":one": typed(1),
                                                                ":below": typed(below - 1)})
        for found in list(old):
            if int(found["version"]) not in kept:
                self.table.client.delete_item(TableName=self.table.name,
                                              Key=item({"pk": _key(tenant_id, name), "version": int(found["version"])}))
                deleted += 1
        return deleted

    def extend_catalog_version(self, tenant_id: str, name: str, version: int, until: float) -> None:
        try:
            self.table.update({"pk": _key(tenant_id, name), "version": version},
                              UpdateExpression="SET expires_at = :u, #ttl = :t",
                              ConditionExpression="attribute_exists(content) AND expires_at < :u",
                              ExpressionAttributeNames={"#ttl": "ttl"},
                              ExpressionAttributeValues={":u": typed(until), ":t": typed(ttl_of(until))})
        except self.table.refused:
            pass  # moved already by another decision, or no longer expiring

    def get_catalog_version(self, tenant_id: str, name: str, version: int) -> CatalogVersion | None:
        if version < 1:
            return None
        found = self.table.get({"pk": _key(tenant_id, name), "version": version})
        return None if found is None or not _live(found, time.time()) else _catalog_version(found)

    def latest_catalog_version(self, tenant_id: str, name: str) -> CatalogVersion | None:
        reply = self.table.client.query(TableName=self.table.name, KeyConditionExpression="pk = :p AND #v >= :one",
                                        ScanIndexForward=False, Limit=1, ConsistentRead=True,
                                        ExpressionAttributeNames={"#v": "version"},
                                        ExpressionAttributeValues={":p": {"S": _key(tenant_id, name)}, ":one": typed(1)})
        return _catalog_version(plain(reply["Items"][0])) if reply["Items"] else None

    def list_catalog_versions(self, tenant_id: str, name: str, after: int = 0, limit: int | None = None
                              ) -> list[CatalogVersion]:
        found: list[CatalogVersion] = []
        start = None
        while limit is None or len(found) < limit:  # each page asks for what is still wanted, no more
            extra = {"ExclusiveStartKey": start} if start else {}
            if limit is not None:
                extra["Limit"] = limit - len(found)
            reply = self.table.client.query(
                TableName=self.table.name, KeyConditionExpression="pk = :p AND #v > :a", ConsistentRead=True,
                FilterExpression=_LIVE, ExpressionAttributeNames={"#v": "version"},
                ExpressionAttributeValues={":p": {"S": _key(tenant_id, name)}, ":a": typed(max(after, HEAD)),
                                           ":now": typed(time.time())}, **extra)
            found.extend(_catalog_version(plain(one)) for one in reply["Items"])
            start = reply.get("LastEvaluatedKey")
            if not start:
                break
        return found

    def list_catalog_tenants(self) -> Iterator[str]:
        """A Scan of the heads' index for their tenant ids alone (IAM grants the scheduled
        refit exactly that: dynamodb:Select SPECIFIC_ATTRIBUTES, that attribute)."""
        seen: set[str] = set()
        for one in self.table.scan_pages(IndexName="by_tenant", Select="SPECIFIC_ATTRIBUTES", ProjectionExpression="tenant_id"):
            if one["tenant_id"] not in seen:
                seen.add(one["tenant_id"])
                yield one["tenant_id"]

    def due_refits(self, tenant_id: str, after: str, limit: int) -> list[str]:
        condition, values = "tenant_id = :t", {":t": {"S": tenant_id}, ":head": typed(HEAD), ":daily": {"S": "daily"}}
        if after:  # a key holds no empty string
            condition += " AND name_version > :a"
            values[":a"] = {"S": after}
        heads = self.table.query_pages(IndexName="by_tenant", KeyConditionExpression=condition,
                                       FilterExpression="#v = :head AND refit = :daily", ProjectionExpression="#n",
                                       ExpressionAttributeNames={"#n": "name", "#v": "version"},
                                       ExpressionAttributeValues=values)
        found: list[str] = []
        for head in heads:
            found.append(head["name"])
            if len(found) == limit:
                break
        heads.close()
        return found

    def count_catalogs(self, tenant_id: str) -> int:
        """The tenant's count item: its entries, each added in the write that created it."""
        found = self.table.get(_count_key(tenant_id))
        return int(found["entries"]) if found is not None else 0

    def list_catalogs(self, tenant_id: str, after: str = "", limit: int | None = None) -> Iterator[CatalogVersion]:
        """Each entry's latest version: the heads name them (and, for an entry written before
        heads, its versions' index items), then each latest is read."""
        listed = self.table.query_pages(IndexName="by_tenant", KeyConditionExpression="tenant_id = :t",
                                        ProjectionExpression="#n, #v, latest",
                                        ExpressionAttributeNames={"#n": "name", "#v": "version"},
                                        ExpressionAttributeValues={":t": {"S": tenant_id}})
        newest: dict[str, int] = {}
        for one in listed:
            number = int(one.get("latest") or one["version"])
            newest[one["name"]] = max(number, newest.get(one["name"], 0))
        given = 0
        for name, number in sorted(newest.items()):
            if name > after and (limit is None or given < limit):
                version = self.get_catalog_version(tenant_id, name, number)
                if version is not None:  # read one at a time: a page stops reading where it ends
                    given += 1
                    yield version


    def adopt_entries_without_heads(self, keep_s: float) -> int:
        """Give each entry written before heads existed its head, take its versions out of the
        index, and set the versions it replaced to expire in `keep_s`; the entries adopted.
        Safe to run again, and beside writers (a head a write made first is left as it is)."""
        legacy: dict[str, tuple[str, str]] = {}
        names: dict[str, set[str]] = {}  # every tenant's entries, heads or not: its count
        indexed = self.table.scan_pages(IndexName="by_tenant", ProjectionExpression="tenant_id, #n, #v",
                                        ExpressionAttributeNames={"#n": "name", "#v": "version"})
        for one in indexed:  # the index: heads, and the versions of entries without one
            names.setdefault(one["tenant_id"], set()).add(one["name"])
            if int(one["version"]) != HEAD:
                legacy[_key(one["tenant_id"], one["name"])] = (one["tenant_id"], one["name"])
        adopted, until = 0, time.time() + keep_s
        for key, (tenant_id, name) in sorted(legacy.items()):
            latest = self.latest_catalog_version(tenant_id, name)
            if latest is None:
                continue
            enforcing_since = latest.enforced_since
            head = {"pk": key, "version": HEAD, "tenant_id": tenant_id, "name_version": name, "name": name,
                    "latest": latest.version, "refit": latest.refit, "enforcing_since": enforcing_since}
            try:
                self.table.put({k: v for k, v in head.items() if v is not None},
                               ConditionExpression="attribute_not_exists(pk)")
                adopted += 1
            except self.table.refused:
                pass  # a write gave it one since the scan
            versions = self.table.query_pages(KeyConditionExpression="pk = :p AND #v >= :one", ProjectionExpression="#v",
                                              ExpressionAttributeNames={"#v": "version"},
                                              ExpressionAttributeValues={":p": {"S": key}, ":one": typed(1)})
            for number in [int(v["version"]) for v in versions]:
                sets, values, attributes = ["tenant = :t"], {":t": {"S": tenant_id}}, {}
                if number < latest.version and number != enforcing_since:  # replaced: it expires
                    sets += ["expires_at = :e", "#ttl = :ttl"]
                    values.update({":e": typed(until), ":ttl": typed(ttl_of(until))})
                    attributes["#ttl"] = "ttl"
                if number == latest.version and enforcing_since is not None:
                    sets.append("enforcing_since = :s")
                    values[":s"] = typed(enforcing_since)
                self.table.update({"pk": key, "version": number}, ConditionExpression="attribute_exists(pk)",
                                  UpdateExpression=f"SET {', '.join(sets)} REMOVE tenant_id, name_version",
                                  ExpressionAttributeValues=values,
                                  **({"ExpressionAttributeNames": attributes} if attributes else {}))
        for tenant_id, entries in sorted(names.items()):
            # Each tenant's count item, from its entries: what the cap counts from now on (an
            # entry created while this runs may be counted once more on the next run).
            self.table.update(_count_key(tenant_id), UpdateExpression="SET entries = :n",
                              ExpressionAttributeValues={":n": typed(len(entries))})
        return adopted


def _key(tenant_id: str, name: str) -> str:
    return f"{tenant_id}#{name}"


def _count_key(tenant_id: str) -> dict[str, Any]:
    """The tenant's count of entries: `<tenant>#` (a name is never empty), outside the index."""
    return {"pk": f"{tenant_id}#", "version": HEAD}


def _live(found: dict[str, Any], now: float) -> bool:
    """TTL deletion lags by up to days; expiry does not."""
    return found.get("expires_at") is None or found["expires_at"] > now


def _catalog_version(found: dict[str, Any]) -> CatalogVersion:
    since = found.get("enforcing_since")
    return CatalogVersion(found.get("tenant") or found["tenant_id"], found["name"], int(found["version"]),
                          found["content_hash"], found["content"], found["created_at"], found.get("expires_at"),
                          None if since is None else int(since))
