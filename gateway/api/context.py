"""The caller of a route: the principal the handler found before the body was read."""

from __future__ import annotations

from typing import Any

from gateway.auth.credentials import Principal
from gateway.errors import Forbidden, Unauthenticated


def caller(router: Any, scope: str | None) -> Principal:
    """The principal, holding `scope` (None: any credential); the tenant joins the log context."""
    principal = router.context.get("principal")
    if principal is None:
        raise Unauthenticated("missing credentials")
    if scope is not None and scope not in principal.scopes:
        raise Forbidden(f"this credential lacks the {scope!r} scope")
    router.append_context(tenant_id=principal.tenant_id)
    return principal


def request_id(router: Any) -> str:
    return str(router.context.get("request_id", ""))
