"""The Lambda REQUEST authorizer for `Authorization: Bearer ...` callers (API keys and
minted tokens).

It verifies the credential and always answers with a policy: Allow plus the principal
in the context when the credential is good; Allow with an empty tenant and a reason
when it is not, so the gateway function refuses the call with a 401 in the body shape
of the route's API (API Gateway's own 401 body is neither OpenAI's nor System One's).
The policy covers the whole stage, because API Gateway caches it per credential; the
context carries the credential's expiry, which the function checks on every call, so a
cached authorization never outlives its credential.

Results are also cached here, keyed by a SHA-256 of the credential (never the
credential itself), for at most `CACHE_S` and never past the credential's expiry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from typing import Any

from gateway.errors import Unauthenticated

log = logging.getLogger("gateway.authorizer")
CACHE_S = 60.0
CACHE_ENTRIES = 1024
_authenticator = None
_cache: dict[str, tuple[float, Any]] = {}
_cache_lock = threading.Lock()


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from gateway.observability import configure_logging

    configure_logging()
    headers = {k.lower(): v for k, v in (event.get("headers") or {}).items()}
    authorization = headers.get("authorization")
    try:
        principal = _cached_authenticate(authorization)
    except Unauthenticated as exc:
        log.info("credential refused", extra={"reason": exc.message})
        return _policy(event, "anonymous", {"tenant_id": "", "reason": exc.message})
    context_values = {
        "tenant_id": principal.tenant_id,
        "scopes": " ".join(sorted(principal.scopes)),
        "models": "*" if principal.models is None else json.dumps(sorted(principal.models)),
        "credential_id": principal.credential_id,
    }
    if principal.expires_at is not None:
        context_values["expires_at"] = str(principal.expires_at)
    return _policy(event, principal.tenant_id, context_values)


def _cached_authenticate(authorization: str | None) -> Any:
    authenticator = _warm_authenticator()
    if not authorization:
        return authenticator.authenticate(authorization)
    key = hashlib.sha256(authorization.encode()).hexdigest()
    now = time.time()
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
    principal = authenticator.authenticate(authorization)
    until = now + CACHE_S if principal.expires_at is None else min(now + CACHE_S, principal.expires_at)
    with _cache_lock:
        if len(_cache) >= CACHE_ENTRIES:
            _cache.clear()  # bounded: a flood of distinct credentials cannot grow memory
        _cache[key] = (until, principal)
    return principal


def set_authenticator(authenticator: Any) -> None:
    global _authenticator
    _authenticator = authenticator
    with _cache_lock:
        _cache.clear()


def _warm_authenticator() -> Any:
    if _authenticator is None:
        from gateway.auth.factory import build_authenticator
        from gateway.settings import AuthSettings

        authenticator = build_authenticator(AuthSettings.from_env())
        if authenticator is None:
            raise RuntimeError("no tenant store configured (GATEWAY_SQLITE_PATH or the DynamoDB tables)")
        set_authenticator(authenticator)
    return _authenticator


def _policy(event: dict[str, Any], principal_id: str, context: dict[str, str]) -> dict[str, Any]:
    return {
        "principalId": principal_id,
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": stage_arn(event.get("methodArn", ""))}],
        },
        "context": context,
    }


def stage_arn(method_arn: str) -> str:
    """arn:aws:execute-api:region:account:api/stage/VERB/path -> arn:...:api/stage/*"""
    prefix, _, rest = method_arn.partition(":execute-api:")
    parts = rest.split("/")
    if not prefix or len(parts) < 2:
        return method_arn or "*"
    return f"{prefix}:execute-api:{parts[0]}/{parts[1]}/*"
