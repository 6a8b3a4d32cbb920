"""Model names and aliases to endpoint pools (see `pools` for how a pool is tried), and
what a container's refusal becomes."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.backends.base import EndpointRejected
from gateway.decisions.pools import EndpointPool
from gateway.errors import InvalidRequest, NotFound, PayloadTooLarge, RequestError


@dataclass(frozen=True)
class ModelRoute:
    name: str
    aliases: tuple[str, ...]
    serves: tuple[str, ...]
    description: str
    release_date: str
    pool: EndpointPool


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
