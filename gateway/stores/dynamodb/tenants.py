"""Tenants, IAM principal rules, API key records and token revocations in DynamoDB.

Tenants table: tenants (`TENANT#<id>` / `TENANT`) and IAM principal rules
(`PRINCIPAL#<normalised arn>` / `RULE`). Keys table: API key records (`KEY#<key id>` /
`KEY`, found per tenant through the `by_tenant` index on `tenant_id` + `created_at`),
token revocations (`REVOKED` / `<tenant>#<token id>`, removed by DynamoDB's TTL on `ttl`
once the token expired) and "not before" times (`NOTBEFORE` / `<subject>`). Every read
of the hot path is a GetItem by key.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.auth.store import ApiKeyRecord, PrincipalRule, Tenant, TenantLimits
from gateway.stores.dynamodb.items import Table, item, tuple_or_none, typed

_REVOKED = "REVOKED"
_KEY_ATTRIBUTES = ("key_id", "tenant_id", "key_hash", "scopes", "created_at")


class DynamoDBTenants:
    def __init__(self, client: Any, tenants_table: str, keys_table: str) -> None:
        self.tenants = Table(client, tenants_table)
        self.keys = Table(client, keys_table)

    # -- tenants ----------------------------------------------------------------------

    def put_tenant(self, tenant: Tenant) -> None:
        self.tenants.put({
            "pk": f"TENANT#{tenant.tenant_id}", "sk": "TENANT", "tenant_id": tenant.tenant_id, "name": tenant.name,
            "created_at": tenant.created_at, "catalog_only": tenant.catalog_only, "limits": json.dumps(tenant.limits.as_json()),
        })

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        found = self.tenants.get({"pk": f"TENANT#{tenant_id}", "sk": "TENANT"})
        if found is None:
            return None
        limits = TenantLimits.from_json(json.loads(found["limits"]) if found.get("limits") else None)
        return Tenant(found["tenant_id"], found["name"], found["created_at"], bool(found.get("catalog_only", False)), limits)

    # -- principal rules --------------------------------------------------------------

    def put_principal_rule(self, rule: PrincipalRule) -> None:
        self.tenants.put({
            "pk": f"PRINCIPAL#{rule.principal_arn}", "sk": "RULE", "principal_arn": rule.principal_arn,
            "tenant_id": rule.tenant_id, "scopes": list(rule.scopes), "models": _list_or_none(rule.models),
            "created_at": rule.created_at,
        })

    def get_principal_rule(self, principal_arn: str) -> PrincipalRule | None:
        found = self.tenants.get({"pk": f"PRINCIPAL#{principal_arn}", "sk": "RULE"})
        if found is None:
            return None
        return PrincipalRule(found["principal_arn"], found["tenant_id"], tuple(found["scopes"]),
                             tuple_or_none(found.get("models")), found["created_at"])

    def delete_principal_rule(self, principal_arn: str) -> bool:
        key = item({"pk": f"PRINCIPAL#{principal_arn}", "sk": "RULE"})
        reply = self.tenants.client.delete_item(TableName=self.tenants.name, Key=key, ReturnValues="ALL_OLD")
        return "Attributes" in reply

    # -- API keys ---------------------------------------------------------------------

    def put_api_key(self, record: ApiKeyRecord) -> None:
        values = {
            "pk": f"KEY#{record.key_id}", "sk": "KEY", "key_id": record.key_id, "tenant_id": record.tenant_id,
            "key_hash": record.key_hash, "scopes": list(record.scopes), "models": _list_or_none(record.models),
            "created_at": record.created_at, "expires_at": record.expires_at, "revoked_at": record.revoked_at,
            "last_used_at": record.last_used_at, "name": record.name,
        }
        try:
            self.keys.put(values, ConditionExpression="attribute_not_exists(pk)")
        except self.keys.refused:
            raise ValueError(f"key id {record.key_id!r} exists") from None

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        found = self.keys.get({"pk": f"KEY#{key_id}", "sk": "KEY"})
        # An item without a hash, tenant or scopes is no key: the functions' only write to a key
        # item (its last use) creates one where no key exists, and it must read as none (401).
        if found is None or not all(name in found for name in _KEY_ATTRIBUTES):
            return None
        return _api_key(found)

    def list_api_keys(self, tenant_id: str) -> list[ApiKeyRecord]:
        found = self.keys.query_pages(IndexName="by_tenant", KeyConditionExpression="tenant_id = :t",
                                      ExpressionAttributeValues={":t": {"S": tenant_id}})
        return [_api_key(one) for one in found if one.get("sk") == "KEY"]

    def revoke_api_key(self, key_id: str, when: float) -> bool:
        try:
            self.keys.update(
                {"pk": f"KEY#{key_id}", "sk": "KEY"}, UpdateExpression="SET revoked_at = :w",
                ConditionExpression="attribute_exists(pk) AND (attribute_not_exists(revoked_at) OR revoked_at = :null)",
                ExpressionAttributeValues={":w": typed(when), ":null": {"NULL": True}},
            )
        except self.keys.refused:
            return False
        return True

    def touch_api_key(self, key_id: str, when: float) -> None:
        try:
            self.keys.update({"pk": f"KEY#{key_id}", "sk": "KEY"}, UpdateExpression="SET last_used_at = :w",
                             ConditionExpression="attribute_exists(pk)", ExpressionAttributeValues={":w": typed(when)})
        except self.keys.refused:
            pass

    # -- token revocations --------------------------------------------------------------

    def revoke_token(self, token_id: str, tenant_id: str, expires_at: float) -> None:
        self.keys.put({"pk": _REVOKED, "sk": f"{tenant_id}#{token_id}", "tenant_id": tenant_id, "expires_at": expires_at,
                       "ttl": int(expires_at) + 3600, "created_at": time.time()})

    def token_revoked(self, tenant_id: str, token_id: str, now: float) -> bool:
        found = self.keys.get({"pk": _REVOKED, "sk": f"{tenant_id}#{token_id}"})
        return found is not None and found["expires_at"] > now

    def set_not_before(self, subject: str, when: float) -> None:
        try:
            self.keys.put({"pk": "NOTBEFORE", "sk": subject, "at": when},
                          ConditionExpression="attribute_not_exists(pk) OR #at < :at",
                          ExpressionAttributeNames={"#at": "at"}, ExpressionAttributeValues={":at": typed(when)})
        except self.keys.refused:
            pass  # a later time is set already: keep it

    def not_before(self, subject: str) -> float | None:
        found = self.keys.get({"pk": "NOTBEFORE", "sk": subject})
        return None if found is None else found["at"]


def _list_or_none(values: tuple[str, ...] | None) -> list[str] | None:
    return None if values is None else list(values)


def _api_key(found: dict[str, Any]) -> ApiKeyRecord:
    return ApiKeyRecord(
        key_id=found["key_id"], tenant_id=found["tenant_id"], key_hash=found["key_hash"], scopes=tuple(found["scopes"]),
        models=tuple_or_none(found.get("models")), created_at=found["created_at"], expires_at=found.get("expires_at"),
        revoked_at=found.get("revoked_at"), last_used_at=found.get("last_used_at"), name=found.get("name", ""),
    )
