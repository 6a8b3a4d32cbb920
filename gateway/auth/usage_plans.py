"""Per-tenant throttling in AWS: API Gateway usage plans, keyed by the authorizer.

The API reads API keys from the authorizer (`ApiKeySourceType: AUTHORIZER`): the
authorizer answers each request with the tenant's `usageIdentifierKey`, and API
Gateway throttles each key on its own, at its usage plan's rate and burst. Callers
never see or send these keys; they are identifiers for metering, not credentials.

One plan exists per (rate, burst) pair, shared by the tenants with those numbers (a
plan's throttle applies per key, so tenants on one plan still have separate buckets);
each tenant gets its own key on the plan of its limits.
"""

from __future__ import annotations

import secrets
from typing import Any

from gateway.auth.store import Tenant

PLAN_PREFIX = "decision-gateway"


def plan_name(rate_per_s: float, burst: int) -> str:
    return f"{PLAN_PREFIX}-{rate_per_s:g}rps-{burst}burst"


def assign_usage_plan(tenant: Tenant, api_id: str, stage: str, client: Any = None) -> str:
    """Give `tenant` a fresh key on the plan of its limits (creating the plan if needed);
    the tenant's earlier keys are deleted. Returns the key's value, for the tenant's record."""
    if client is None:
        import boto3

        client = boto3.client("apigateway")
    limits = tenant.limits
    plan_id = _plan(client, api_id, stage, limits.rate_per_s, limits.burst)
    name = f"{PLAN_PREFIX}-tenant-{tenant.tenant_id}"
    earlier = [key["id"] for key in _pages(client.get_api_keys, "items", nameQuery=name) if key.get("name") == name]
    key = client.create_api_key(name=name, enabled=True, value=secrets.token_urlsafe(30),
                                description=f"usage identifier of tenant {tenant.tenant_id} (not a credential)")
    client.create_usage_plan_key(usagePlanId=plan_id, keyId=key["id"], keyType="API_KEY")
    plans = [plan["id"] for plan in _pages(client.get_usage_plans, "items")]
    for key_id in earlier:
        for earlier_plan in plans:  # the tenant may have moved plans: its old key leaves wherever it was
            try:
                client.delete_usage_plan_key(usagePlanId=earlier_plan, keyId=key_id)
            except client.exceptions.NotFoundException:
                pass
        client.delete_api_key(apiKey=key_id)
    return key["value"]


def _plan(client: Any, api_id: str, stage: str, rate_per_s: float, burst: int) -> str:
    name = plan_name(rate_per_s, burst)
    for plan in _pages(client.get_usage_plans, "items"):
        if plan.get("name") == name and any(s.get("apiId") == api_id and s.get("stage") == stage
                                            for s in plan.get("apiStages", [])):
            return plan["id"]
    created = client.create_usage_plan(name=name, apiStages=[{"apiId": api_id, "stage": stage}],
                                       throttle={"rateLimit": rate_per_s, "burstLimit": burst},
                                       description="tenants with these limits; each has its own key and bucket")
    return created["id"]


def _pages(call: Any, field: str, **kwargs: Any) -> list[dict[str, Any]]:
    items, position = [], None
    while True:
        reply = call(**kwargs, **({"position": position} if position else {}))
        items.extend(reply.get(field, []))
        position = reply.get("position")
        if not position:
            return items
