"""The Lambda REQUEST authorizer for `Authorization: Bearer ...` callers.

It verifies the credential and always answers with a policy: Allow plus the principal
in the context when the credential is good; Allow with an empty tenant and a reason
when it is not, so the gateway function refuses the call with a 401 in the body shape
of the route's API (API Gateway's own 401 body is neither OpenAI's nor System One's).
The policy covers the whole stage, because API Gateway caches it per credential.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from gateway.errors import Unauthenticated

log = logging.getLogger("gateway.authorizer")
_authenticator = None


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    from gateway.observability import configure_logging

    configure_logging()
    headers = {k.lower(): v for k, v in (event.get("headers") or {}).items()}
    try:
        principal = _warm_authenticator().authenticate(headers.get("authorization"))
    except Unauthenticated as exc:
        log.info("credential refused", extra={"reason": exc.message})
        return _policy(event, "anonymous", {"tenant_id": "", "reason": exc.message})
    return _policy(
        event,
        principal.tenant_id,
        {
            "tenant_id": principal.tenant_id,
            "scopes": " ".join(sorted(principal.scopes)),
            "models": "*" if principal.models is None else json.dumps(sorted(principal.models)),
            "credential_id": principal.credential_id,
        },
    )


def set_authenticator(authenticator: Any) -> None:
    global _authenticator
    _authenticator = authenticator


def _warm_authenticator() -> Any:
    if _authenticator is None:
        import os

        from gateway.auth.authenticate import Authenticator
        from gateway.stores.sqlite import SQLiteStore

        path = os.environ.get("GATEWAY_SQLITE_PATH")
        if not path:
            raise RuntimeError("no tenant store configured (GATEWAY_SQLITE_PATH)")
        set_authenticator(Authenticator(SQLiteStore(path)))
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
