"""Building the gateway for tests: settings, runtime, API Gateway events, a tenant."""

from __future__ import annotations

import base64
import json
from typing import Any

from gateway.auth.tokens import CachedKeyRing, new_key_document
from gateway.composition import build_runtime
from gateway.handler import GatewayFunction
from gateway.local import proxy_event
from gateway.services.runtime import GatewayRuntime
from gateway.settings import GatewaySettings

PRINCIPAL = {"principalId": "acme", "tenant_id": "acme", "scopes": "chat decide", "models": "*", "credential_id": "k1"}


def settings_for(endpoint_url: str | None = None, *, endpoints: tuple[str, ...] = ("dg-cpu",),
                 urls: dict[str, str] | None = None, **extra: Any) -> GatewaySettings:
    """Two models over one pool; every endpoint at `endpoint_url`, or each at its own `urls[name]`."""
    urls = urls or ({name: endpoint_url for name in endpoints} if endpoint_url else {})
    pool = [{"name": name, **({"endpoint_url": urls[name]} if name in urls else {})} for name in endpoints]
    return GatewaySettings.model_validate({
        "region": "us-east-1",
        "models": [
            {"name": "decision-default", "aliases": ["jev-latest"], "serves": ["decisions"], "description": "decisions",
             "release_date": "2026-11-01", "endpoints": pool},
            {"name": "chat-default", "serves": ["chat"], "endpoints": pool},
        ],
        **extra,
    })


RECORD_KEYS = new_key_document()  # the records' state-hash keys of every test runtime


_function: GatewayFunction | None = None  # the function the test last built, which `call` invokes


def install(backend: Any = None, endpoint_url: str | None = None, authenticator: Any = None,
            settings: GatewaySettings | None = None, **kwargs: Any) -> GatewayRuntime:
    """Build the test's own function (a fresh app and runtime) for `call`; returns its runtime."""
    global _function
    runtime = build_runtime(settings or settings_for(endpoint_url, **kwargs), backend, authenticator=authenticator,
                            record_keys=CachedKeyRing(lambda: RECORD_KEYS))
    _function = GatewayFunction(runtime)
    return runtime


def _installed_function() -> GatewayFunction:
    if _function is None:
        raise RuntimeError("install() the test's gateway first")
    return _function


def installed() -> GatewayRuntime:
    """The runtime of the function `call` invokes."""
    return _installed_function().runtime


def call_installed(ev: dict[str, Any], context: Any) -> dict[str, Any]:
    """The function `install` built last, as a Lambda handler (for a local runner in a test)."""
    return _installed_function()(ev, context)


def event(method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None,
          principal: dict[str, str] | None = PRINCIPAL, raw: bytes | None = None) -> dict[str, Any]:
    """The proxy event API Gateway sends after the authorizer accepted `principal`."""
    data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    ev = proxy_event(method, path, list(all_headers.items()), data, "127.0.0.1")
    if principal is not None:
        ev["requestContext"]["authorizer"] = dict(principal)
    return ev


def call(ev: dict[str, Any], function: GatewayFunction | None = None) -> tuple[int, dict[str, str], Any]:
    """Invoke `function` (by default the one `install` built); returns (status, lower-cased
    headers, parsed JSON body or text)."""
    result = function(ev, None) if function is not None else call_installed(ev, None)
    headers = {k.lower(): v for k, v in (result.get("headers") or {}).items()}
    for name, values in (result.get("multiValueHeaders") or {}).items():
        headers[name.lower()] = values[-1]
    body = result.get("body") or ""
    if result.get("isBase64Encoded"):
        body = base64.b64decode(body).decode()
    try:
        return result["statusCode"], headers, json.loads(body)
    except ValueError:
        return result["statusCode"], headers, body


def register_credentials(store: Any, *contexts: dict[str, str]) -> None:
    """Store an API key record for each authorizer context's credential, so that the
    function's revocation check (which looks the key up on every request) finds it live."""
    from gateway.auth.store import ApiKeyRecord

    for context in contexts:
        if store.get_api_key(context["credential_id"]) is None:
            store.put_api_key(ApiKeyRecord(context["credential_id"], context["tenant_id"], "unused", tuple(context["scopes"].split()),
                                           None, 0.0))


def tenant_store(path: Any, *tenants: str) -> Any:
    """A real SQLite store at `path` holding the named tenants (default limits)."""
    from gateway.auth.tenants import create_tenant
    from gateway.stores.sqlite import SQLiteStore

    store = SQLiteStore(path)
    for tenant in tenants:
        create_tenant(store, tenant)
    return store


def unthrottled(store: Any, *tenants: str) -> None:
    """Limits no test traffic reaches, for stacks whose subject is not the per-tenant throttle
    (a module's tests in a row send more than a tenant's default 20 requests in 2 s)."""
    from gateway.auth.tenants import set_limits

    for tenant in tenants:
        set_limits(store, tenant, rate_per_s=10_000, burst=100_000, max_in_flight=10_000)
