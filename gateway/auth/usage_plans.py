"""Per-tenant throttling in AWS: API Gateway usage plans, keyed by the authorizer.

The API reads API keys from the authorizer (`ApiKeySourceType: AUTHORIZER`): the
authorizer answers each request with the tenant's `usageIdentifierKey`, and API
Gateway throttles each key on its own, at its usage plan's rate and burst. Callers
never see or send these keys; they are identifiers for metering, not credentials.

One plan exists per (rate, burst) pair, shared by the tenants with those numbers (a
plan's throttle applies per key, so tenants on one plan still have separate buckets);
each tenant gets its own key on the plan of its limits. A tenant without a key of its
own uses the stack's shared key, so all such tenants share one bucket: give every
tenant that needs isolation its own key (`admin set-limits TENANT --usage-plan ...`).

A tenant's earlier key keeps working after it is replaced, because the authorizer's
caches (the tenant cache and API Gateway's, 60 s each) may name it for two minutes
more; it is marked replaced, and deleted by a later assignment once
`RETIRE_AFTER_S` have passed.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from gateway.auth.store import Tenant

PLAN_PREFIX = "decision-gateway"
RETIRE_AFTER_S = 300.0
_REPLACED = "replaced at "


def plan_name(rate_per_s: float, burst: int) -> str:
    return f"{PLAN_PREFIX}-{rate_per_s:g}rps-{burst}burst"


def assign_usage_plan(tenant: Tenant, api_id: str, stage: str, client: Any, now: float | None = None) -> str:
    """Give `tenant` a fresh key on the plan of its limits (creating the plan if needed);
    its earlier keys are marked replaced, and deleted once replaced `RETIRE_AFTER_S` ago.
    Returns the key's value, for the tenant's record."""
    now = time.time() if now is None else now
    limits = tenant.limits
    plan_id = _plan(client, api_id, stage, limits.rate_per_s, limits.burst)
    name = f"{PLAN_PREFIX}-tenant-{tenant.tenant_id}"
    earlier = [key for key in _pages(client.get_api_keys, "items", nameQuery=name) if key.get("name") == name]
    key = client.create_api_key(name=name, enabled=True, value=secrets.token_urlsafe(30),
                                description=f"usage identifier of tenant {tenant.tenant_id} (not a credential)")
    client.create_usage_plan_key(usagePlanId=plan_id, keyId=key["id"], keyType="API_KEY")
    plans = [plan["id"] for plan in _pages(client.get_usage_plans, "items")]
    for old in earlier:
        description = old.get("description") or ""
        if not description.startswith(_REPLACED):
            client.update_api_key(apiKey=old["id"], patchOperations=[
                {"op": "replace", "path": "/description", "value": f"{_REPLACED}{now:.0f}"}])
        elif now - float(description[len(_REPLACED):]) >= RETIRE_AFTER_S:
            for earlier_plan in plans:  # the tenant may have moved plans: its old key leaves wherever it was
                try:
                    client.delete_usage_plan_key(usagePlanId=earlier_plan, keyId=old["id"])
                except client.exceptions.NotFoundException:
                    pass
            client.delete_api_key(apiKey=old["id"])
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
