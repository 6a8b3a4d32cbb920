"""The gateway function built in process, for the benchmarks and the tests: its settings, the
function itself, and the API Gateway events it is called with."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from devkit.local import proxy_event
from gateway.auth.tokens import CachedKeyRing, new_key_document
from gateway.functions.composition import build_services
from gateway.functions.handler import GatewayFunction
from gateway.services.instance import InstanceServices
from gateway.settings import GatewaySettings

PRINCIPAL = {"principalId": "acme", "tenant_id": "acme", "scopes": "chat decide", "models": "*", "credential_id": "k1"}


def settings_for(endpoint_url: str | None = None, *, endpoints: tuple[str, ...] = ("dg-cpu",),
                 urls: dict[str, str] | None = None, usd_per_hour: float | None = None, **extra: Any) -> GatewaySettings:
    """Two models over one pool; every endpoint at `endpoint_url`, or each at its own `urls[name]`,
    each priced at `usd_per_hour` when given."""
    urls = urls or ({name: endpoint_url for name in endpoints} if endpoint_url else {})
    price = {} if usd_per_hour is None else {"usd_per_hour": usd_per_hour}
    pool = [{"name": name, **({"endpoint_url": urls[name]} if name in urls else {}), **price} for name in endpoints]
    return GatewaySettings.model_validate({
        "region": "us-east-1",
        "models": [
            {"name": "decision-default", "aliases": ["jev-latest"], "serves": ["decisions"], "description": "decisions",
             "release_date": "2026-11-01", "endpoints": pool},
            {"name": "chat-default", "serves": ["chat"], "endpoints": pool},
        ],
        **extra,
    })


RECORD_KEYS = new_key_document()  # the records' state-hash keys of every services built here


_function: GatewayFunction | None = None  # the function built last, which `call_installed` invokes


def install(backend: Any = None, endpoint_url: str | None = None, stores: Any = None, authenticator: Any = None,
            settings: GatewaySettings | None = None, **kwargs: Any) -> InstanceServices:
    """Build a fresh function (a fresh app and services) for `call_installed`, on `stores` and
    `authenticator` (none: the settings'); returns its services."""
    global _function
    services = build_services(settings or settings_for(endpoint_url, **kwargs), backend, stores=stores,
                            authenticator=authenticator,
                            record_keys=CachedKeyRing(lambda: RECORD_KEYS))
    _function = GatewayFunction(services)
    return services


def _installed_function() -> GatewayFunction:
    if _function is None:
        raise RuntimeError("install() the gateway first")
    return _function


def installed() -> InstanceServices:
    """The services of the function `call_installed` invokes."""
    return _installed_function().services


def call_installed(ev: dict[str, Any], context: Any) -> dict[str, Any]:
    """The function `install` built last, as a Lambda handler (for a local runner)."""
    return _installed_function()(ev, context)


def stream_installed(ev: dict[str, Any], context: Any) -> Iterator[bytes]:
    """The same function's streaming entry point (the local runner's streaming routes)."""
    return _installed_function().stream(ev, context)


call_installed.stream = stream_installed  # type: ignore[attr-defined]  # what InProcessFunction streams with


def event(method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None,
          principal: dict[str, str] | None = PRINCIPAL, raw: bytes | None = None) -> dict[str, Any]:
    """The proxy event API Gateway sends after the authorizer accepted `principal`."""
    data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    ev = proxy_event(method, path, list(all_headers.items()), data, "127.0.0.1")
    if principal is not None:
        ev["requestContext"]["authorizer"] = dict(principal)
    return ev
