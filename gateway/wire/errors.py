"""The one place where errors become HTTP bodies.

System One routes answer `{"detail": [...]}` (422) or `{"detail": {"error_type", "message"}}`;
OpenAI routes answer `{"error": {"message", "type", "param", "code"}}`. 429 and 503
carry `Retry-After`; an error that retrying cannot mend carries `x-should-retry: false`
(the OpenAI SDKs read it before their own rules, which would retry a 504 twice).
Nothing below the gateway's own messages reaches a caller.
"""

from __future__ import annotations

from typing import Any, Literal

from gateway.errors import BackendUnavailable, GatewayError, InvalidRequest, RateLimited
from systemone.errors import openai_body, system_one_body

Flavor = Literal["systemone", "openai"]

def error_body(exc: GatewayError, flavor: Flavor) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) for an error on a route of the given flavor."""
    headers: dict[str, str] = {}
    if isinstance(exc, RateLimited | BackendUnavailable):
        headers["Retry-After"] = str(exc.retry_after)
    if exc.retryable is False:
        headers["x-should-retry"] = "false"
    details = exc.details if isinstance(exc, InvalidRequest) else None
    if flavor == "systemone":
        return exc.status, system_one_body(exc.error_type, exc.message, details), headers
    return exc.status, openai_body(exc.message, exc.openai_type, exc.openai_code, details), headers
