"""Who calls: the principal of a proxy event, found before the body is read.

The bearer authorizer put a principal (or a refusal) in `requestContext.authorizer`;
for `/iam` routes API Gateway authenticated SigV4 and put the caller in
`requestContext.identity`. Either way the credential is checked for revocation here,
on every request, because API Gateway may have served the authorization from its
cache. The handler does this first, so an unauthenticated request costs a dictionary
lookup and gets 401 before its body is decoded, inflated, parsed or validated.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.auth.credentials import Principal
from gateway.errors import BackendUnavailable, Unauthenticated


def principal_of(event: dict[str, Any], authenticator: Any, now: float) -> Principal:
    request_context = event.get("requestContext") or {}
    context = request_context.get("authorizer") or {}
    if "tenant_id" in context:
        if context["tenant_id"]:
            principal = _from_context(context)
        elif context.get("unverified") and authenticator is not None:
            principal = _authenticate_again(event, authenticator)
        else:
            raise Unauthenticated(str(context.get("reason") or "invalid credentials"))
        # API Gateway may serve a cached authorization: expiry and revocation still hold.
        if authenticator is not None:
            return authenticator.still_valid(principal)  # expiry included
        if principal.expires_at is not None and principal.expires_at <= now:
            raise Unauthenticated("invalid credentials")
        return principal
    identity = request_context.get("identity") or {}
    # API Gateway fills userArn (and accessKey) only for a method that authenticated SigV4.
    if identity.get("userArn") and identity.get("accessKey"):
        if authenticator is None:
            raise Unauthenticated("IAM callers are not configured on this gateway")
        return authenticator.authenticate_iam(identity["userArn"])
    raise Unauthenticated("missing credentials: send Authorization: Bearer <API key or token>, or sign with SigV4")


def _from_context(context: dict[str, Any]) -> Principal:
    models = context.get("models", "*")
    return Principal(
        tenant_id=str(context["tenant_id"]),
        scopes=frozenset(str(context.get("scopes", "")).split()),
        models=None if models == "*" else frozenset(json.loads(models)),
        credential_id=str(context.get("credential_id", "")),
        expires_at=_number(context.get("expires_at")),
        # A context cached by API Gateway before `kind` existed: token ids are 32 hex digits, key ids 16.
        kind=str(context.get("kind") or ("token" if len(str(context.get("credential_id", ""))) == 32 else "api_key")),
        issued_at=_number(context.get("issued_at")),
        subject=str(context.get("subject") or ""),
        key_id=str(context.get("key_id") or ""),
    )


def _authenticate_again(event: dict[str, Any], authenticator: Any) -> Principal:
    """The authorizer could not reach the store or the keys: try once more from here."""
    headers = {k.lower(): v for k, v in (event.get("headers") or {}).items() if isinstance(k, str)}
    try:
        return authenticator.authenticate(headers.get("authorization"))
    except Unauthenticated:
        raise
    except Exception:
        raise BackendUnavailable("credentials cannot be checked right now; retry shortly", retry_after=2) from None


def _number(value: Any) -> float | None:
    return float(value) if value not in (None, "") else None
