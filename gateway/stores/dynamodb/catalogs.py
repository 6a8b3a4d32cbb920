"""Catalog versions in DynamoDB: partition `pk` = `<tenant>#<name>`, numeric sort key
`version`; the `by_tenant` index (`tenant_id`, `name_version`) lists a tenant's entries.
A version is written only where none is: a race never loses one."""

from __future__ import annotations

from typing import Any

from gateway.catalogs.model import CatalogVersion
from gateway.catalogs.store import VersionTaken
from gateway.stores.dynamodb.items import Table, plain, typed


class DynamoDBCatalogs:
    def __init__(self, client: Any, catalogs_table: str) -> None:
        self.table = Table(client, catalogs_table)

    def insert_catalog_version(self, version: CatalogVersion) -> None:
        values = {"pk": f"{version.tenant_id}#{version.name}", "version": version.version, "tenant_id": version.tenant_id,
                  "name": version.name, "name_version": f"{version.name}#{version.version:09d}",
                  "content_hash": version.content_hash, "content": version.content, "created_at": version.created_at}
        try:
            self.table.put(values, ConditionExpression="attribute_not_exists(pk)")
        except self.table.refused:
            raise VersionTaken(version.ref) from None

    def get_catalog_version(self, tenant_id: str, name: str, version: int) -> CatalogVersion | None:
        found = self.table.get({"pk": f"{tenant_id}#{name}", "version": version})
        return None if found is None else _catalog_version(found)

    def latest_catalog_version(self, tenant_id: str, name: str) -> CatalogVersion | None:
        reply = self.table.client.query(TableName=self.table.name, KeyConditionExpression="pk = :p", ScanIndexForward=False,
                                        Limit=1, ConsistentRead=True,
                                        ExpressionAttributeValues={":p": {"S": f"{tenant_id}#{name}"}})
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
                ExpressionAttributeNames={"#v": "version"},
                ExpressionAttributeValues={":p": {"S": f"{tenant_id}#{name}"}, ":a": typed(after)}, **extra)
            found.extend(_catalog_version(plain(one)) for one in reply["Items"])
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
            reply = self.table.client.scan(TableName=self.table.name, Select="SPECIFIC_ATTRIBUTES",
                                           ProjectionExpression="tenant_id", **extra)
            found.update(plain(one)["tenant_id"] for one in reply["Items"])
            start = reply.get("LastEvaluatedKey")
            if not start:
                return sorted(found)

    def list_catalogs(self, tenant_id: str) -> list[CatalogVersion]:
        """Each entry's latest version. The tenant's versions are listed by name and number
        alone, then each latest is read: an entry refitted daily gains a version of up to
        ~48 KB a day, and reading every version's content made this list (and the 256 MB
        function that serves it) grow without bound."""
        listed = self.table.query_pages(IndexName="by_tenant", KeyConditionExpression="tenant_id = :t",
                                        ProjectionExpression="#n, #v", ExpressionAttributeNames={"#n": "name", "#v": "version"},
                                        ExpressionAttributeValues={":t": {"S": tenant_id}})
        newest: dict[str, int] = {}
        for one in listed:
            newest[one["name"]] = max(int(one["version"]), newest.get(one["name"], 0))
        found = (self.get_catalog_version(tenant_id, name, version) for name, version in sorted(newest.items()))
        return [version for version in found if version is not None]


def _catalog_version(found: dict[str, Any]) -> CatalogVersion:
    return CatalogVersion(found["tenant_id"], found["name"], int(found["version"]), found["content_hash"], found["content"],
                          found["created_at"])
