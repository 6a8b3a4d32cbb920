"""Model names and aliases to endpoint pools (see `pools` for how a pool is tried)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gateway.backends.base import Endpoint
from gateway.backends.pools import EndpointPool
from gateway.errors import NotFound


@dataclass(frozen=True, slots=True)
class ModelRoute:
    name: str
    aliases: tuple[str, ...]
    serves: tuple[str, ...]
    description: str
    release_date: str
    pool: EndpointPool
    max_request_tokens: int = 32000


class ModelRegistry:
    def __init__(self, routes: Iterable[ModelRoute]) -> None:
        self.routes = tuple(routes)
        self._by_name: dict[str, ModelRoute] = {}
        for route in self.routes:
            for name in (route.name, *route.aliases):
                self._by_name[name] = route

    def reseed(self) -> None:
        """Fresh entropy for every pool's random order and back-off: instances resumed from one
        SnapStart snapshot would otherwise all draw the same sequence (and pick the same
        endpoint first)."""
        for pool in dict.fromkeys(route.pool for route in self.routes):
            pool.rng.seed()

    def endpoints(self) -> list[Endpoint]:
        """Every endpoint some route can call, once each."""
        return list(dict.fromkeys(member.endpoint for route in self.routes for member in route.pool.members))

    def first_attempts(self) -> list[Endpoint]:
        """Every endpoint as an ordinary request's first attempt calls it, once each."""
        return list(dict.fromkeys(e for route in self.routes for e in route.pool.first_attempts()))

    def route_for(self, name: str, service: str) -> ModelRoute:
        route = self._by_name.get(name)
        if route is None or service not in route.serves:
            what = "decision" if service == "decisions" else "chat"
            raise NotFound(f"the {what} model {name!r} does not exist; GET /v1/models lists the available models")
        return route
