"""What a route knows of its invocation besides the request: the caller (the principal the
handler found before the body was read), the request id, and whether the response streams
(the streaming integration: a body handed over as it is produced, and the longer deadline)."""

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


def streaming(router: Any) -> bool:
    """The response streams to the caller (the streaming integration), so a route may send its
    body as it is produced and work within the longer deadline."""
    return bool(router.context.get("streaming"))


def wait_preference(router: Any) -> float | None:
    """The caller's `Prefer: wait=N` (RFC 7240): how many seconds it will wait for the answer;
    None when it sent none. A preference that does not parse is ignored, as the RFC says."""
    header = router.current_event.headers.get("prefer") or ""  # Powertools' headers ignore case
    for preference in header.replace(";", ",").split(","):
        name, _, value = preference.strip().partition("=")
        if name.strip().lower() == "wait" and value.strip().isdigit() and 0 < int(value.strip()) <= 86400:
            return float(value.strip())
    return None


def batch_line(router: Any) -> Any:
    """The batch line this request is (`gateway.batches.worker.LineCall`), or None for a caller's own request."""
    return router.context.get("batch_line")
