"""What the tenant spent: `GET /v1/usage`, by day and by catalog entry, with its budgets."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query

from gateway.api.context import caller
from gateway.api.docs import UNSERVED, ResponseDocs
from gateway.api.responses import json_response
from gateway.auth.store import TenantLimits
from gateway.errors import Forbidden
from gateway.services.spending import MAX_USAGE_DAYS, Spending
from gateway.services.throttle import checked
from gateway.wire import responses

DAY = r"^\d{4}-\d{2}-\d{2}$"
# Usage names the tenant's catalog entries: whoever may read the catalogs, or an admin.
READERS = frozenset({"admin", "catalogs:read"})


def router(spending: Spending, limits: Callable[[str], TenantLimits], clock: Callable[[], float] = time.time,
           doc: ResponseDocs = UNSERVED) -> Router:
    routes = Router()

    @routes.get("/v1/usage", tags=["Usage"],
                summary=f"The tenant's spend and endpoint time by day (UTC) and by catalog entry, at most {MAX_USAGE_DAYS}"
                        " days at once (default: this month), with its budgets",
                responses=doc(responses.UsageReport, "Totals, by day, by entry, and the budgets"))
    def usage(first: Annotated[str | None, Query(alias="from", pattern=DAY, description="First day, YYYY-MM-DD")] = None,
              last: Annotated[str | None, Query(alias="to", pattern=DAY, description="Last day, YYYY-MM-DD")] = None):
        principal = caller(routes, None)
        if not READERS & principal.scopes:
            raise Forbidden("reading usage needs the 'admin' or 'catalogs:read' scope (it names catalog entries)")
        today = time.strftime("%Y-%m-%d", time.gmtime(clock()))
        tenant_limits = checked(lambda: limits(principal.tenant_id), "budgets")
        report = spending.usage(principal.tenant_id, first or today[:8] + "01", last or today, tenant_limits)
        return json_response(200, report)

    return routes
