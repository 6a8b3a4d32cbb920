"""Model names and aliases to endpoint pools, and one pass over a pool.

A pool is tried in its configured order. An endpoint that is busy (saturated,
starting, throttled, timed out) hands the request to the next one; a refusal by the
container (its 4xx) is the caller's and goes straight back, since every endpoint would
say the same.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.backends.base import (
    Endpoint,
    EndpointBusy,
    EndpointFailed,
    EndpointRejected,
    InferenceBackend,
    Route,
)
from gateway.errors import BackendFailed, BackendUnavailable, InvalidRequest, NotFound, PayloadTooLarge, RequestError

log = logging.getLogger("gateway.routing")


@dataclass(frozen=True)
class ModelRoute:
    name: str
    aliases: tuple[str, ...]
    serves: tuple[str, ...]
    description: str
    release_date: str
    endpoints: tuple[Endpoint, ...]


@dataclass(frozen=True)
class Invocation:
    body: bytes
    endpoint: str
    attempts: int


class ModelRegistry:
    def __init__(self, routes: Iterable[ModelRoute]) -> None:
        self.routes = tuple(routes)
        self._by_name: dict[str, ModelRoute] = {}
        for route in self.routes:
            for name in (route.name, *route.aliases):
                self._by_name[name] = route

    def resolve(self, name: str, service: str) -> ModelRoute:
        route = self._by_name.get(name)
        if route is None or service not in route.serves:
            what = "decision" if service == "decisions" else "chat"
            raise NotFound(f"the {what} model {name!r} does not exist; GET /v1/models lists the available models")
        return route


def invoke_pool(backend: InferenceBackend, route: ModelRoute, payload: dict[str, Any], kind: Route) -> Invocation:
    """Try each endpoint of the pool in order; the first answer wins."""
    body = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    busy: list[EndpointBusy] = []
    for attempt, endpoint in enumerate(route.endpoints, start=1):
        try:
            return Invocation(backend.invoke(endpoint, body, kind), endpoint.name, attempt)
        except EndpointBusy as exc:
            log.warning("endpoint busy", extra={"endpoint": exc.endpoint, "reason": exc.reason, "attempt": attempt})
            busy.append(exc)
        except EndpointRejected as exc:
            raise rejection_error(exc) from None
        except EndpointFailed as exc:
            log.error("endpoint failed", extra={"endpoint": exc.endpoint, "reason": exc.reason, "attempt": attempt})
            raise BackendFailed("the model endpoint failed on this request") from None
    retry_after = max((exc.retry_after or 0 for exc in busy), default=0) or 5
    raise BackendUnavailable("every endpoint for this model is busy; retry later", retry_after=retry_after)


def rejection_error(exc: EndpointRejected) -> RequestError:
    """A container's 4xx, in the gateway's own error types (its messages are written for callers)."""
    try:
        body = json.loads(exc.body or b"null")
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    if exc.status == 422 and isinstance(detail, list) and all(isinstance(d, dict) and "loc" in d for d in detail):
        return InvalidRequest(detail)
    message = "the model refused this request"
    if isinstance(detail, dict) and isinstance(detail.get("message"), str):
        message = detail["message"]
    elif isinstance(body, dict) and isinstance(body.get("error"), dict) and isinstance(body["error"].get("message"), str):
        message = body["error"]["message"]
    if exc.status == 413:
        return PayloadTooLarge(message)
    if exc.status == 422:
        return InvalidRequest.at([], message)
    return RequestError(message)
