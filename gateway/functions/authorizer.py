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
credential itself), for at most `CACHE_S` and never past the credential's expiry; a
cache hit still asks the revocation check (`gateway.auth.revocation`), and so does the
function for an authorization API Gateway cached, so no cache outlives a revocation
by more than the check's bound.

Nothing here raises: a store or key ring that cannot be read becomes a refusal marked
`unverified`, which the function answers by checking the credential itself (a store
hiccup must not lock a good key out for the length of API Gateway's cache), and
which is never cached here.

The policy names the tenant's usage key (`usageIdentifierKey`; the API reads keys from
the authorizer), so that API Gateway's usage plans throttle a tenant with a key of its
own on its own; tenants without one share `GATEWAY_DEFAULT_USAGE_KEY` (one bucket), and
refused callers share `GATEWAY_REFUSED_USAGE_KEY`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from typing import Any

from gateway.auth.authenticate import Authenticator
from gateway.auth.credentials import Principal
from gateway.auth.store import TenantLimits
from gateway.errors import Unauthenticated

log = logging.getLogger("gateway.functions.authorizer")
CACHE_S = 60.0
CACHE_ENTRIES = 1024


class Authorizer:
    """The authorizer with one authenticator and its own result cache: tests and the local
    runner build their own; Lambda gets the one `lambda_handler` builds from the environment."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._cache_lock = threading.Lock()

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        from gateway.observability import configure_logging

        configure_logging()
        headers = {k.lower(): v for k, v in (event.get("headers") or {}).items() if isinstance(k, str)}
        authorization = headers.get("authorization")
        try:
            principal = self._authenticate(authorization if isinstance(authorization, str) else None)
            usage_key = self.limits(principal.tenant_id).usage_key or os.environ.get(DEFAULT_USAGE_KEY)
        except Unauthenticated as exc:
            log.info("credential refused", extra={"reason": exc.message})
            return _policy(event, "anonymous", {"tenant_id": "", "reason": exc.message},
                           os.environ.get(REFUSED_USAGE_KEY))
        except Exception:  # never an error: API Gateway would answer 500 to a caller who did nothing wrong
            log.exception("the credential could not be checked; the function checks it again")
            # Not the refused callers' bucket: an attacker keeping that one empty must not
            # throttle good callers through a store hiccup.
            return _policy(event, "anonymous", {"tenant_id": "", "reason": "credentials could not be checked",
                                                "unverified": "1"}, os.environ.get(DEFAULT_USAGE_KEY))
        return _policy(event, principal.tenant_id, principal_context(principal), usage_key)

    def limits(self, tenant_id: str) -> TenantLimits:
        """A tenant's limits, as the authorizer reads them (the local runner throttles by them)."""
        return self.authenticator.limits(tenant_id)

    def _authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            return self.authenticator.authenticate(authorization)
        key = hashlib.sha256(authorization.encode("utf-8", "surrogatepass")).hexdigest()
        now = time.time()
        with self._cache_lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return self.authenticator.still_valid(hit[1])  # revoked since it was cached: refused
        principal = self.authenticator.authenticate(authorization)
        until = now + CACHE_S if principal.expires_at is None else min(now + CACHE_S, principal.expires_at)
        with self._cache_lock:
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.clear()  # bounded: a flood of distinct credentials cannot grow memory
            self._cache[key] = (until, principal)
        return principal


def _built_in_init_phase() -> Authorizer | None:
    """In Lambda, the authorizer is built while the module loads (the init phase, which a
    SnapStart snapshot carries): settings, the stores' clients and the key ring, no secret's
    value and no store read. What fails here is built again on the first invocation."""
    if not os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        return None  # tests and the local runner build their own
    try:
        return Authorizer(authenticator_from_env())
    except Exception:
        log.exception("the authorizer could not be built in the init phase; the first invocation tries again")
        return None


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    global _authorizer
    if _authorizer is None:
        try:
            _authorizer = Authorizer(authenticator_from_env())
        except Exception:  # a store that cannot be configured: refuse as unverified, never a 500
            log.exception("the authorizer cannot be built")
            return _policy(event, "anonymous", {"tenant_id": "", "reason": "credentials could not be checked",
                                                "unverified": "1"}, os.environ.get(DEFAULT_USAGE_KEY))
    return _authorizer(event, context)


def authenticator_from_env() -> Authenticator:
    from gateway.functions.composition import build_authenticator
    from gateway.settings import AuthSettings

    authenticator = build_authenticator(AuthSettings.from_env())
    if authenticator is None:
        raise RuntimeError("no tenant store configured (GATEWAY_SQLITE_PATH or the DynamoDB tables)")
    return authenticator


REFUSED_USAGE_KEY = "GATEWAY_REFUSED_USAGE_KEY"
DEFAULT_USAGE_KEY = "GATEWAY_DEFAULT_USAGE_KEY"


def principal_context(principal: Any) -> dict[str, str]:
    """The principal as API Gateway context values (strings; the function reads them back)."""
    values = {
        "tenant_id": principal.tenant_id,
        "scopes": " ".join(sorted(principal.scopes)),
        "models": "*" if principal.models is None else json.dumps(sorted(principal.models)),
        "credential_id": principal.credential_id,
        "kind": principal.kind,
    }
    if principal.expires_at is not None:
        values["expires_at"] = str(principal.expires_at)
    if principal.issued_at is not None:
        values["issued_at"] = str(principal.issued_at)
    if principal.subject:
        values["subject"] = principal.subject
    if principal.key_id:
        values["key_id"] = principal.key_id
    return values


def _policy(event: dict[str, Any], principal_id: str, context: dict[str, str], usage_key: str | None) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "principalId": principal_id,
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": "Allow",
                           "Resource": stage_arn(str(event.get("methodArn") or ""))}],
        },
        "context": context,
    }
    if usage_key:
        policy["usageIdentifierKey"] = usage_key
    return policy


def stage_arn(method_arn: str) -> str:
    """arn:aws:execute-api:region:account:api/stage/VERB/path -> arn:...:api/stage/*"""
    prefix, _, rest = method_arn.partition(":execute-api:")
    parts = rest.split("/")
    if not prefix or len(parts) < 2:
        return method_arn or "*"
    return f"{prefix}:execute-api:{parts[0]}/{parts[1]}/*"


_authorizer = _built_in_init_phase()  # kept while the container is warm
