"""What a route knows of its invocation besides the request: the caller (the principal the
handler found before the body was read), the request id, and whether the response streams
(the streaming integration: a body handed over as it is produced, and the longer deadline)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

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


class StreamedBody(Protocol):
    def __iter__(self) -> Iterator[bytes]: ...

    def __next__(self) -> bytes: ...

    def close(self) -> None: ...


class StreamSlot:
    """Where a route leaves a body that streams, for the handler to send after the status and
    headers of the route's response (Powertools' responses hold whole bodies only)."""

    def __init__(self) -> None:
        self.body: StreamedBody | None = None


def streaming(router: Any) -> bool:
    """The response streams to the caller (the streaming integration), so a route may send its
    body as it is produced and work within the longer deadline."""
    return router.context.get("stream") is not None


def wait_preference(router: Any) -> float | None:
    """The caller's `Prefer: wait=N` (RFC 7240): how many seconds it will wait for the answer;
    None when it sent none. A preference that does not parse is ignored, as the RFC says."""
    header = router.current_event.headers.get("prefer") or ""  # Powertools' headers ignore case
    for preference in header.replace(";", ",").split(","):
        name, _, value = preference.strip().partition("=")
        if name.strip().lower() == "wait" and value.strip().isdigit() and 0 < int(value.strip()) <= 86400:
            return float(value.strip())
    return None


def stream_body(router: Any, body: StreamedBody) -> None:
    router.context["stream"].body = body
